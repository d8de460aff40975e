# cmake -DBENCH=... -DMPIEXEC=... -DEXTRA=... -DJSON=... -P check_bench_passes.cmake
# allreduce_bench --passes 2 over 2 sizes x 2 widths on 2 ranks: the table has each of
# the 4 rows once (printed in the last pass), its header says how the median was taken,
# and the JSON holds 4 records that carry iters 2 and passes 2; with --link tcp-1gbit every
# row has its roofline (floor, wire, x_roof) and every record the same in JSON.
separate_arguments(extra UNIX_COMMAND "${EXTRA}")
file(REMOVE "${JSON}")
execute_process(COMMAND ${MPIEXEC} -n 2 ${extra} ${BENCH} -b 64K -e 128K -f 2 -n 2 -w 1 --passes 2 --bits 4,32
                        --native-below 0 --link tcp-1gbit --json ${JSON}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "allreduce_bench failed (${rc}):\n${out}\n${err}")
endif()
if(NOT out MATCHES "median over 2 passes of the sweep x 2 iterations")
  message(FATAL_ERROR "header does not describe the passes:\n${out}")
endif()
# count(<var> <regex> <text>): how many times regex matches in text.
function(count var regex text)
  string(REGEX MATCHALL "${regex}" found "${text}")
  list(LENGTH found n)
  set(${var} ${n} PARENT_SCOPE)
endfunction()

count(nrows "\n +(65536|131072) +[0-9]+ +float +sra +(4|32) " "${out}")
if(NOT nrows EQUAL 4)
  message(FATAL_ERROR "expected each of the 4 rows once, found ${nrows}:\n${out}")
endif()
file(READ "${JSON}" js)
count(nrecs "\"iters\": 2, \"passes\": 2," "${js}")
count(nall "\"bytes\":" "${js}")
if(NOT nrecs EQUAL 4 OR NOT nall EQUAL 4)
  message(FATAL_ERROR "expected 4 JSON records with iters 2 and passes 2, found ${nrecs} of ${nall}:\n${js}")
endif()
if(NOT out MATCHES "# roofline: copy bandwidth [0-9.]+ GB/s per rank" OR NOT out MATCHES "at 1.000 Gbit/s, shared")
  message(FATAL_ERROR "header does not give the roofline's bandwidth and link:\n${out}")
endif()
count(nroof " +(65536|131072) +[0-9]+ +float +sra +(4|32) [^\n]+\\| +[0-9]+\\.[0-9] +[0-9]+\\.[0-9] +[0-9]+\\.[0-9]+x\n"
      "${out}")
count(njroof "\"copy_bw_gbps\": [0-9.]+, \"wire_s\": [0-9.e+-]+, \"mem_bytes\": [0-9]+, \"mem_floor_s\": [0-9.e+-]+, \"x_roof\": [0-9.]+, \"native_below\": [0-9]+}" "${js}")
if(NOT nroof EQUAL 4 OR NOT njroof EQUAL 4)
  message(FATAL_ERROR "expected the roofline (floor, wire, x_roof) in 4 rows and 4 records, found ${nroof} and ${njroof}:\n${out}\n${js}")
endif()
message(STATUS "allreduce_bench --passes 2: 4 rows, 4 records, each with its roofline")
