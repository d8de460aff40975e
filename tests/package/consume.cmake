# Driver of the consumer tests (see CMakeLists.txt in this folder):
#   cmake -DMODE=<mode> -DSETTINGS=<package_settings.cmake> -DWORK=<dir> -P consume.cmake
# MODE: install | find_package | find_package_cuda | find_package_nccl | add_subdirectory | fetchcontent
#       | install_c | find_package_c | find_package_fortran.
# Everything happens under WORK/MODE, which is wiped first; `install` leaves the package
# in WORK/prefix for the find_package modes (a CTest fixture orders them), `install_c`
# that package plus the C library and Fortran module in WORK/prefix-c.
cmake_minimum_required(VERSION 3.24)
foreach(v MODE SETTINGS WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "consume.cmake: -D${v}=... is required")
  endif()
endforeach()
include(${SETTINGS})

set(dir ${WORK}/${MODE})
set(prefix ${WORK}/prefix)
set(prefix_c ${WORK}/prefix-c)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})

function(_now out)
  string(TIMESTAMP s "%s")
  string(TIMESTAMP us "%f")
  math(EXPR ms "${s} * 1000 + ${us} / 1000")
  set(${out} ${ms} PARENT_SCOPE)
endfunction()
_now(t_start)

# step(<what> [EXPECT_FAIL] [MATCH <regex>] COMMAND <cmd>...)
# Runs cmd; fails the test (printing its output) when the exit status is not the one
# expected or the output does not match MATCH.
function(step what)
  cmake_parse_arguments(ARG "EXPECT_FAIL" "MATCH" "COMMAND" ${ARGN})
  _now(t0)
  execute_process(COMMAND ${ARG_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  _now(t1)
  math(EXPR ms "${t1} - ${t0}")
  set(ok TRUE)
  if(ARG_EXPECT_FAIL AND rc EQUAL 0)
    set(ok FALSE)
    set(why "succeeded, but it must fail")
  elseif(NOT ARG_EXPECT_FAIL AND NOT rc EQUAL 0)
    set(ok FALSE)
    set(why "failed (${rc})")
  elseif(DEFINED ARG_MATCH AND NOT out MATCHES "${ARG_MATCH}")
    set(ok FALSE)
    set(why "output does not match '${ARG_MATCH}'")
  endif()
  list(JOIN ARG_COMMAND " " cmd)
  if(NOT ok)
    message("${out}")
    message(FATAL_ERROR "[${MODE}] ${what} ${why}:\n  ${cmd}")
  endif()
  message(STATUS "[${MODE}] ${what}: ok (${ms} ms)")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# Configure arguments shared by every project configured here: the compiler, MPI and
# generator of the outer build; never the user's package registry.
set(common -G ${CGX_GENERATOR} -DCMAKE_CXX_COMPILER=${CGX_CXX_COMPILER}
           -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON -DCMAKE_FIND_PACKAGE_NO_SYSTEM_PACKAGE_REGISTRY=ON)
if(CGX_MAKE_PROGRAM)
  list(APPEND common -DCMAKE_MAKE_PROGRAM=${CGX_MAKE_PROGRAM})
endif()
if(CGX_BUILD_TYPE)
  list(APPEND common -DCMAKE_BUILD_TYPE=${CGX_BUILD_TYPE})
endif()
foreach(v MPI_CXX_COMPILER MPI_HOME MPIEXEC_EXECUTABLE)
  if(CGX_${v})
    list(APPEND common -D${v}=${CGX_${v}})
  endif()
endforeach()

set(consumer ${CMAKE_COMMAND} -S ${CGX_CONSUMER_DIR} -B ${dir}/build ${common}
             -DCGX_EXPECTED_VERSION=${CGX_VERSION})

# Builds the consumer and runs it on 2 ranks with the launch line of cgxTesting.cmake.
function(build_and_run)
  step("build consumer" COMMAND ${CMAKE_COMMAND} --build ${dir}/build)
  step("run consumer on 2 ranks" MATCH "cgx consumer OK: 2 ranks"
       COMMAND ${CGX_MPIEXEC_EXECUTABLE} ${CGX_MPIEXEC_NUMPROC_FLAG} 2 ${CGX_MPIEXEC_EXTRA} ${CGX_MPIEXEC_PREFLAGS}
               ${dir}/build/cgx_consumer ${CGX_MPIEXEC_POSTFLAGS})
  message(STATUS "[${MODE}] ${step_output}")
endfunction()

if(MODE STREQUAL "install")
  # Install with tests, examples and benchmarks off, into a staging prefix, then move
  # the package elsewhere: consumers must find it relocated. The header-only package:
  # without the compiled libraries (the C library, installed by install_c from this
  # build; the preload), minutes of compile each.
  step("configure cgx for install"
       COMMAND ${CMAKE_COMMAND} -S ${CGX_SOURCE_DIR} -B ${dir}/cgx-build ${common} -DCGX_BUILD_TESTS=OFF
               -DCGX_BUILD_EXAMPLES=OFF -DCGX_BUILD_BENCH=OFF -DCGX_BUILD_C=OFF -DCGX_BUILD_PRELOAD=OFF
               --no-warn-unused-cli -DCMAKE_INSTALL_PREFIX=${dir}/never-used)
  step("build cgx" COMMAND ${CMAKE_COMMAND} --build ${dir}/cgx-build)
  step("install cgx" COMMAND ${CMAKE_COMMAND} --install ${dir}/cgx-build --prefix ${dir}/stage)
  file(REMOVE_RECURSE ${prefix})
  file(RENAME ${dir}/stage ${prefix})
  # Every header of the source tree is installed.
  file(GLOB_RECURSE src_headers RELATIVE ${CGX_SOURCE_DIR}/include ${CGX_SOURCE_DIR}/include/cgx/*)
  foreach(h IN LISTS src_headers)
    if(NOT EXISTS ${prefix}/include/${h})
      message(FATAL_ERROR "[install] header ${h} is not installed")
    endif()
  endforeach()
  list(LENGTH src_headers nh)
  # The package files exist, and none names the source, build or staging directory.
  file(GLOB_RECURSE config_files ${prefix}/*.cmake)
  foreach(f cgxConfig.cmake cgxConfigVersion.cmake cgxTargets.cmake)
    if(NOT config_files MATCHES "/${f}(;|$)")
      message(FATAL_ERROR "[install] ${f} is not installed (installed: ${config_files})")
    endif()
  endforeach()
  foreach(f IN LISTS config_files)
    file(READ ${f} text)
    foreach(bad ${CGX_SOURCE_DIR} ${dir}/cgx-build ${dir}/stage)
      string(FIND "${text}" "${bad}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "[install] ${f} names ${bad}: the package is not relocatable")
      endif()
    endforeach()
  endforeach()
  set(names "")
  foreach(f IN LISTS config_files)
    get_filename_component(n ${f} NAME)
    list(APPEND names ${n})
  endforeach()
  list(JOIN names ", " names)
  message(STATUS "[install] ${nh} headers and ${names} in ${prefix}; relocatable")

elseif(MODE STREQUAL "find_package")
  if(NOT EXISTS ${prefix}/include/cgx/cgx.hpp)
    message(FATAL_ERROR "[find_package] no package in ${prefix}: run the package.install test first")
  endif()
  step("configure consumer (find_package)"
       COMMAND ${consumer} -DCGX_CONSUME=find_package -DCMAKE_PREFIX_PATH=${prefix} -DCGX_EXPECTED_PREFIX=${prefix})
  build_and_run()

elseif(MODE STREQUAL "find_package_cuda" OR MODE STREQUAL "find_package_nccl")
  # Configure only (no CUDA is compiled): the components (cuda; cuda nccl) are found and
  # cgx::cuda / cgx::nccl resolve at generate time (cgx::nccl to this machine's NCCL,
  # found again by cgxConfig.cmake); an unknown component and a missing toolkit are errors.
  set(cuda_hint "")
  if(CGX_CUDATOOLKIT_ROOT)
    set(cuda_hint -DCUDAToolkit_ROOT=${CGX_CUDATOOLKIT_ROOT})
  endif()
  set(fp -DCMAKE_PREFIX_PATH=${prefix} -DCGX_EXPECTED_PREFIX=${prefix} ${cuda_hint})
  step("configure consumer (${MODE})" COMMAND ${consumer} -DCGX_CONSUME=${MODE} ${fp})
  if(MODE STREQUAL "find_package_cuda")
    file(REMOVE_RECURSE ${dir}/build)
    step("configure consumer (COMPONENTS no_such_component) fails" EXPECT_FAIL MATCH "set[ \n]+cgx_FOUND[ \n]+to[ \n]+FALSE"
         COMMAND ${consumer} -DCGX_CONSUME=find_package_bogus ${fp})
  endif()
  file(REMOVE_RECURSE ${dir}/build)
  step("configure consumer (${MODE}, no CUDA toolkit) fails" EXPECT_FAIL MATCH "set[ \n]+cgx_FOUND[ \n]+to[ \n]+FALSE"
       COMMAND ${consumer} -DCGX_CONSUME=${MODE} ${fp} -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)

elseif(MODE STREQUAL "add_subdirectory")
  step("configure consumer (add_subdirectory)"
       COMMAND ${consumer} -DCGX_CONSUME=add_subdirectory -DCGX_SOURCE_DIR=${CGX_SOURCE_DIR})
  build_and_run()

elseif(MODE STREQUAL "fetchcontent")
  # A tarball of the working tree as it is now (committed or not), fetched by URL with its
  # hash. In a git work tree: the files git lists (tracked, and untracked ones it does not
  # ignore), so nothing .gitignore names goes in (build/ holds build trees, the PyPI torch
  # venv, downloads: gigabytes). Elsewhere (an unpacked release): the top-level entries
  # but .git and build trees.
  set(list_file ${dir}/files.txt)
  find_package(Git QUIET)
  set(listed FALSE)
  if(GIT_EXECUTABLE AND EXISTS ${CGX_SOURCE_DIR}/.git)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${CGX_SOURCE_DIR} ls-files --cached --others --exclude-standard
                    RESULT_VARIABLE rc OUTPUT_FILE ${list_file} ERROR_VARIABLE err)
    if(rc EQUAL 0)
      set(listed TRUE)
      # A file deleted from the work tree but not from the index is listed; tar would fail.
      file(STRINGS ${list_file} files)
      file(WRITE ${list_file} "")
      foreach(f IN LISTS files)
        if(EXISTS ${CGX_SOURCE_DIR}/${f} AND NOT IS_DIRECTORY ${CGX_SOURCE_DIR}/${f})
          file(APPEND ${list_file} "${f}\n")
        endif()
      endforeach()
    endif()
  endif()
  if(NOT listed)
    file(GLOB entries LIST_DIRECTORIES true RELATIVE ${CGX_SOURCE_DIR} ${CGX_SOURCE_DIR}/* ${CGX_SOURCE_DIR}/.*)
    list(REMOVE_DUPLICATES entries)
    file(WRITE ${list_file} "")
    foreach(e IN LISTS entries)
      set(p ${CGX_SOURCE_DIR}/${e})
      if(e MATCHES "^\\.(git|cache|vscode|idea)?$" OR e STREQUAL "build" OR EXISTS ${p}/CMakeCache.txt
         OR p STREQUAL CGX_OUTER_BINARY_DIR)
        continue()
      endif()
      file(APPEND ${list_file} "${e}\n")
    endforeach()
  endif()
  step("tar the working tree" COMMAND ${CMAKE_COMMAND} -E chdir ${CGX_SOURCE_DIR}
                                      ${CMAKE_COMMAND} -E tar czf ${dir}/cgx-src.tar.gz --files-from=${list_file})
  file(SHA256 ${dir}/cgx-src.tar.gz sha)
  step("configure consumer (FetchContent)"
       COMMAND ${consumer} -DCGX_CONSUME=fetchcontent -DCGX_URL=file://${dir}/cgx-src.tar.gz -DCGX_URL_SHA256=${sha}
               -DFETCHCONTENT_TRY_FIND_PACKAGE_MODE=NEVER)
  build_and_run()

elseif(MODE STREQUAL "install_c")
  # The C++-only package of `install` (header-only: built in seconds) plus the install
  # component cgx_c of the build this test belongs to (its libcgx_c, compiled once there,
  # minutes of compile that a fresh build here would repeat), then moved elsewhere.
  if(NOT EXISTS ${prefix}/include/cgx/cgx.hpp)
    message(FATAL_ERROR "[install_c] no package in ${prefix}: run the package.install test first")
  endif()
  file(COPY ${prefix}/ DESTINATION ${dir}/stage)
  step("install component cgx_c of ${CGX_OUTER_BINARY_DIR}"
       COMMAND ${CMAKE_COMMAND} --install ${CGX_OUTER_BINARY_DIR} --component cgx_c --prefix ${dir}/stage)
  file(REMOVE_RECURSE ${prefix_c})
  file(RENAME ${dir}/stage ${prefix_c})
  set(want cgxCTargets.cmake cgxCArch.cmake)
  if(CGX_HAS_FORTRAN)
    list(APPEND want cgxFortranTargets.cmake)
  endif()
  file(GLOB_RECURSE config_files ${prefix_c}/*.cmake)
  foreach(f IN LISTS want)
    if(NOT config_files MATCHES "/${f}(;|$)")
      message(FATAL_ERROR "[install_c] ${f} is not installed (installed: ${config_files})")
    endif()
  endforeach()
  file(GLOB_RECURSE libs ${prefix_c}/*libcgx_c.so* ${prefix_c}/*libcgx_fortran.so* ${prefix_c}/*cgx.mod)
  if(NOT libs MATCHES "libcgx_c[.]so")
    message(FATAL_ERROR "[install_c] libcgx_c.so is not installed")
  endif()
  if(CGX_HAS_FORTRAN AND NOT (libs MATCHES "libcgx_fortran[.]so" AND libs MATCHES "/cgx/fortran/cgx[.]mod"))
    message(FATAL_ERROR "[install_c] the Fortran module is not installed (found: ${libs})")
  endif()
  if(NOT EXISTS ${prefix_c}/include/cgx/c.h)
    message(FATAL_ERROR "[install_c] include/cgx/c.h is not installed")
  endif()
  foreach(f IN LISTS config_files)
    file(READ ${f} text)
    foreach(bad ${CGX_SOURCE_DIR} ${CGX_OUTER_BINARY_DIR} ${dir}/stage)
      string(FIND "${text}" "${bad}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "[install_c] ${f} names ${bad}: the package is not relocatable")
      endif()
    endforeach()
  endforeach()
  list(LENGTH libs nl)
  message(STATUS "[install_c] ${nl} library and module files, ${want} in ${prefix_c}; relocatable")

elseif(MODE STREQUAL "find_package_c" OR MODE STREQUAL "find_package_fortran")
  if(NOT EXISTS ${prefix_c}/include/cgx/c.h)
    message(FATAL_ERROR "[${MODE}] no package in ${prefix_c}: run the package.install_c test first")
  endif()
  # The settings of every project here (the C++ ones go unused), the C compiler and MPI's C wrapper.
  set(lang_args ${common} --no-warn-unused-cli -DCMAKE_C_COMPILER=${CGX_C_COMPILER})
  if(CGX_MPI_C_COMPILER)
    list(APPEND lang_args -DMPI_C_COMPILER=${CGX_MPI_C_COMPILER})
  endif()
  if(MODE STREQUAL "find_package_c")
    set(src ${CGX_SOURCE_DIR}/tests/package/consumer_c)
    set(exe cgx_consumer_c)
    set(ok "cgx C consumer OK: 2 ranks")
  else()
    set(src ${CGX_SOURCE_DIR}/tests/package/consumer_fortran)
    set(exe cgx_consumer_fortran)
    set(ok "cgx Fortran consumer OK: 2 ranks")
    list(APPEND lang_args -DCMAKE_Fortran_COMPILER=${CGX_Fortran_COMPILER})
    if(CGX_MPI_Fortran_COMPILER)
      list(APPEND lang_args -DMPI_Fortran_COMPILER=${CGX_MPI_Fortran_COMPILER})
    endif()
  endif()
  step("configure consumer (${MODE})"
       COMMAND ${CMAKE_COMMAND} -S ${src} -B ${dir}/build ${lang_args} -DCGX_EXPECTED_VERSION=${CGX_VERSION}
               -DCMAKE_PREFIX_PATH=${prefix_c} -DCGX_EXPECTED_PREFIX=${prefix_c})
  step("build consumer" COMMAND ${CMAKE_COMMAND} --build ${dir}/build)
  step("run consumer on 2 ranks" MATCH "${ok}"
       COMMAND ${CGX_MPIEXEC_EXECUTABLE} ${CGX_MPIEXEC_NUMPROC_FLAG} 2 ${CGX_MPIEXEC_EXTRA} ${CGX_MPIEXEC_PREFLAGS}
               ${dir}/build/${exe} ${CGX_MPIEXEC_POSTFLAGS})
  message(STATUS "[${MODE}] ${step_output}")
  if(MODE STREQUAL "find_package_c")
    # The C++-only installation has no cgx::c: COMPONENTS c with REQUIRED fails, saying why.
    step("configure consumer (COMPONENTS c, a package without it) fails"
         EXPECT_FAIL MATCH "installed[ \n]+without[ \n]+its[ \n]+C[ \n]+library"
         COMMAND ${CMAKE_COMMAND} -S ${src} -B ${dir}/build-missing ${lang_args} -DCGX_EXPECTED_VERSION=${CGX_VERSION}
                 -DCMAKE_PREFIX_PATH=${prefix} -DCGX_EXPECTED_PREFIX=${prefix})
  endif()

else()
  message(FATAL_ERROR "consume.cmake: unknown MODE '${MODE}'")
endif()

_now(t_end)
math(EXPR ms "${t_end} - ${t_start}")
message(STATUS "[${MODE}] passed in ${ms} ms")
