# Included by the C and Fortran consumers: fails the configure unless cgx was found under
# CGX_EXPECTED_PREFIX and its component `component` (c, Fortran) with its target `target`.
function(cgx_expect_found component target)
  file(REAL_PATH "${cgx_DIR}" dir)
  file(REAL_PATH "${CGX_EXPECTED_PREFIX}" want)
  string(FIND "${dir}" "${want}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "cgx consumer (${component}): cgx_DIR is ${cgx_DIR}, not under ${CGX_EXPECTED_PREFIX}")
  endif()
  if(NOT cgx_${component}_FOUND OR NOT TARGET ${target})
    message(FATAL_ERROR "cgx consumer (${component}): cgx_${component}_FOUND is '${cgx_${component}_FOUND}'")
  endif()
endfunction()
