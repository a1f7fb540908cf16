# Cross build for AArch64 Linux (a BlueField DPU's Arm cores) with Debian's
# cross toolchain (gcc-aarch64-linux-gnu) and multiarch :arm64 -dev
# packages (scripts/install-deps.sh --aarch64). Tests run under qemu-user:
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#   cmake --build build-aarch64 && (cd build-aarch64 && ctest)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Debian multiarch: headers in /usr/include, libraries and .pc files in
# /usr/lib/aarch64-linux-gnu (the cross gcc searches there itself).
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# ctest runs the test executables through qemu-user; the :arm64 libc and
# libraries are installed natively (multiarch), so no -L prefix is needed
# beyond the dynamic loader's default paths.
find_program(FT_QEMU_AARCH64 qemu-aarch64)
if(FT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${FT_QEMU_AARCH64})
endif()
