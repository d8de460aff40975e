# cmake -DREADME=... -DSOURCE=... -DNAME=... -P check_readme_snippet.cmake
# Fails unless README quotes the region of SOURCE between "// [snippet:NAME]" markers
# verbatim, inside <!-- snippet:NAME --> ... <!-- /snippet:NAME -->.
file(READ "${SOURCE}" src)
file(READ "${README}" readme)
string(REGEX MATCH "// \\[snippet:${NAME}\\]\n(.*)\n// \\[snippet:${NAME}\\]" _ "${src}")
set(code "${CMAKE_MATCH_1}")
if(code STREQUAL "")
  message(FATAL_ERROR "no snippet '${NAME}' in ${SOURCE}")
endif()
string(REGEX MATCH "<!-- snippet:${NAME} -->\n```cpp\n(.*)\n```\n<!-- /snippet:${NAME} -->" _ "${readme}")
set(quoted "${CMAKE_MATCH_1}")
if(NOT quoted STREQUAL code)
  message(FATAL_ERROR "README.md does not quote ${SOURCE} (snippet '${NAME}') verbatim; update it")
endif()
message(STATUS "README quotes snippet '${NAME}' verbatim")
