# Included by the top-level CMakeLists.txt where CGX_BUILD_C is on: enables the languages
# of the C API and the Fortran module (at the top level, so that examples/ and tests/ can
# use them too) and finds MPI's C and Fortran bindings; src/ builds the libraries.
# CGX_HAS_FORTRAN: whether the Fortran module is built.

# _cgx_same_mpi(<lang> <wrapper>): unless MPI_<lang>_COMPILER is given, the wrapper of
# the MPI the C++ side uses (mpicxx.mpich -> mpicc.mpich, mpifort.mpich), so that an
# MPICH build does not find Open MPI's C or Fortran bindings.
function(_cgx_same_mpi lang wrapper)
  if(NOT MPI_${lang}_COMPILER AND MPI_CXX_COMPILER MATCHES "^(.*)mpicxx([.][^/]*)?$")
    set(w "${CMAKE_MATCH_1}${wrapper}${CMAKE_MATCH_2}")
    if(EXISTS "${w}")
      set(MPI_${lang}_COMPILER "${w}" CACHE FILEPATH "MPI ${lang} compiler wrapper")
    endif()
  endif()
endfunction()

enable_language(C)
_cgx_same_mpi(C mpicc)
find_package(MPI REQUIRED COMPONENTS C)


# AUTO: where a Fortran compiler and MPI's Fortran bindings are found; ON: they must be;
# OFF: never (enable_language(Fortran) is not called).
set(CGX_BUILD_FORTRAN AUTO CACHE STRING "The Fortran module over the C API: AUTO, ON or OFF")
set_property(CACHE CGX_BUILD_FORTRAN PROPERTY STRINGS AUTO ON OFF)
set(_cgx_fortran OFF)
if(CGX_BUILD_FORTRAN)  # ON or AUTO
  if(CGX_BUILD_FORTRAN STREQUAL "AUTO")
    include(CheckLanguage)
    check_language(Fortran)
    if(CMAKE_Fortran_COMPILER)
      set(_cgx_fortran ON)
    else()
      message(STATUS "cgx: no Fortran compiler found: no Fortran module (CGX_BUILD_FORTRAN=AUTO)")
    endif()
  else()
    set(_cgx_fortran ON)
  endif()
endif()
if(_cgx_fortran)
  enable_language(Fortran)
  _cgx_same_mpi(Fortran mpifort)
  if(CGX_BUILD_FORTRAN STREQUAL "AUTO")
    find_package(MPI COMPONENTS Fortran)
  else()
    find_package(MPI REQUIRED COMPONENTS Fortran)
  endif()
  if(NOT MPI_Fortran_FOUND)
    message(STATUS "cgx: MPI's Fortran bindings not found: no Fortran module (CGX_BUILD_FORTRAN=AUTO)")
    set(_cgx_fortran OFF)
  endif()
endif()
set(CGX_HAS_FORTRAN ${_cgx_fortran})
