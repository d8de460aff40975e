# cmake -DREADME=<page.md> -DSOURCE=<file> -DNAME=<name> -P check_readme_snippet.cmake
# Fails unless the page (the README or a page under docs/) quotes the region of SOURCE
# between two "// [snippet:NAME]" marker lines verbatim, inside
# <!-- snippet:NAME --> ... <!-- /snippet:NAME -->. The markers may be indented.
file(READ "${SOURCE}" src)
file(READ "${README}" readme)
string(REGEX MATCH "// \\[snippet:${NAME}\\]\n(.*)\n[ ]*// \\[snippet:${NAME}\\]" _ "${src}")
set(code "${CMAKE_MATCH_1}")
if(code STREQUAL "")
  message(FATAL_ERROR "no snippet '${NAME}' in ${SOURCE}")
endif()
string(REGEX MATCH "<!-- snippet:${NAME} -->\n```cpp\n(.*)\n```\n<!-- /snippet:${NAME} -->" _ "${readme}")
set(quoted "${CMAKE_MATCH_1}")
if(NOT quoted STREQUAL code)
  message(FATAL_ERROR "${README} does not quote ${SOURCE} (snippet '${NAME}') verbatim; update it")
endif()
message(STATUS "${README} quotes snippet '${NAME}' verbatim")
