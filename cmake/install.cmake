# Install rules (FLEXTIER_INSTALL): headers, the libraries (static, and
# shared with FLEXTIER_BUILD_SHARED), the flextier program, pkg-config files
# and a CMake package:
#   include/flextier/*.h
#   lib/libflextier{,-store,-codec}.a  lib/libflextier{,-store,-codec}.so*
#   lib/flextier/libflextier-cuda.so (the CUDA backend plugin, CUDA builds)
#   lib/pkgconfig/flextier{,-store,-codec}.pc
#   lib/cmake/flextier/flextierConfig.cmake (+ Version, Targets)
#   bin/flextier
# Everything is relocatable: `cmake --install BUILD --prefix DIR` works for
# any DIR (the .pc files locate themselves with ${pcfiledir}, the CMake
# package with its own path). tests/install/test_install.sh checks it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flextier)

# Exported names: flextier::codec, flextier::store, flextier::flextier for
# the shared libraries, flextier::codec_static, ... for the static ones.
set_target_properties(flextier-codec PROPERTIES EXPORT_NAME codec_static)
set_target_properties(flextier-store PROPERTIES EXPORT_NAME store_static)
set_target_properties(flextier PROPERTIES EXPORT_NAME flextier_static)
set(_ft_install_targets ${FT_LIBRARIES})
if(FLEXTIER_BUILD_SHARED)
  set_target_properties(flextier-codec-shared PROPERTIES EXPORT_NAME codec)
  set_target_properties(flextier-store-shared PROPERTIES EXPORT_NAME store)
  set_target_properties(flextier-shared PROPERTIES EXPORT_NAME flextier)
  list(APPEND _ft_install_targets flextier-codec-shared flextier-store-shared flextier-shared)
endif()
install(TARGETS ${_ft_install_targets} EXPORT flextierTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/flextier
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
# The CUDA backend plugin (src/cuda), opened by the library on --device
# cuda from lib/flextier/ (relative to libflextier.so or to bin/flextier).
# Not the FT_CUDA=FAKE one: that emulation is for tests only.
if(FT_HAVE_CUDA AND NOT FT_CUDA_FAKE)
  install(TARGETS flextier-cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/flextier)
endif()
if(FLEXTIER_BUILD_CLI)
  set_target_properties(flextier_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS flextier_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# --- CMake package
install(EXPORT flextierTargets NAMESPACE flextier:: DESTINATION ${FT_CMAKE_DIR})
# What the config re-imports for the static libraries: each pkg-config
# module under the prefix the build used (PkgConfig::FT_<NAME>).
set(FT_PKG_DEPS "")
foreach(pair FT_LZ4=liblz4 FT_ZSTD=libzstd FT_DEFLATE=libdeflate FT_XXHASH=libxxhash
             FT_UCX=ucx FT_CRYPTO=libcrypto FT_JSONC=json-c
             FT_PCRE2=libpcre2-8 FT_UTF8PROC=libutf8proc)
  string(APPEND FT_PKG_DEPS "  ${pair}\n")
endforeach()
if(FT_HAVE_SERVER)
  string(APPEND FT_PKG_DEPS "  FT_MHD=libmicrohttpd\n")
  set(FT_PC_REQUIRES_SERVER " libmicrohttpd")
else()
  set(FT_PC_REQUIRES_SERVER "")
endif()
set(FT_WITH_SHARED ${FLEXTIER_BUILD_SHARED})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flextierConfig.cmake.in
  ${PROJECT_BINARY_DIR}/flextierConfig.cmake INSTALL_DESTINATION ${FT_CMAKE_DIR})
# 0.x: a minor version may break compatibility
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_ft_compat SameMinorVersion)
else()
  set(_ft_compat SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flextierConfigVersion.cmake
  COMPATIBILITY ${_ft_compat})
install(FILES ${PROJECT_BINARY_DIR}/flextierConfig.cmake
              ${PROJECT_BINARY_DIR}/flextierConfigVersion.cmake
        DESTINATION ${FT_CMAKE_DIR})

# --- pkg-config: flextier requires flextier-store requires flextier-codec;
# the third-party modules are Requires.private (only a static link needs
# them: no public header exposes their types).
file(RELATIVE_PATH FT_PC_PREFIX_REL "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
foreach(pc flextier-codec flextier-store flextier)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
