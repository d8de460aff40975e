# Cross-compiles cgx for 64-bit Arm Linux with Debian's cross compiler
# (apt-get install g++-aarch64-linux-gnu libc6-dev-arm64-cross) and runs the test
# executables under qemu-user (apt-get install qemu-user):
#
#   cmake -S . -B build/aarch64 --toolchain cmake/toolchains/aarch64-linux-gnu.cmake \
#         -DCGX_REQUIRE_MPI=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCGX_ENABLE_CUDA=OFF
#   cmake --build build/aarch64 --target test_quant && ctest --test-dir build/aarch64 -R '^test_quant$'
#
# There is no aarch64 MPI here, so only the single-process tests are built. Keep FindMPI
# out (CMAKE_DISABLE_FIND_PACKAGE_MPI): it runs the host's mpicxx, and although it then
# reports MPI not found, it still defines MPI::MPI_CXX with the host's include paths.
# doctest is header-only: when it is not under the target root, tests/CMakeLists.txt
# takes the host's copy (or -DCGX_DOCTEST_INCLUDE=DIR).

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Libraries, headers and CMake packages of the target only; programs of the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest (and add_test commands naming a target) run the binaries under qemu, with the
# target's dynamic loader and libraries taken from the cross root.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/usr/aarch64-linux-gnu)
