# A clean build of a tree this machine has built before takes its objects from ccache, where it is
# installed (scripts/install-deps.sh installs it). The precompiled header is passed with -include,
# which ccache understands given these sloppiness settings; the base folder (`source_dir`, the
# tree's root) and an unhashed working folder let a second clone of the same tree hit the cache.
# Included by the main build and by fuzz/, the libFuzzer project it builds beside it.
# -DFERRY_CCACHE=OFF turns it off.
function(ferry_use_ccache source_dir)
  option(FERRY_CCACHE "Compile through ccache where it is installed" ON)
  find_program(FERRY_CCACHE_PROGRAM ccache)
  if(FERRY_CCACHE AND FERRY_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
    set(launcher ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${source_dir} CCACHE_NOHASHDIR=1 ${FERRY_CCACHE_PROGRAM})
    set(CMAKE_C_COMPILER_LAUNCHER ${launcher} PARENT_SCOPE)
    set(CMAKE_CXX_COMPILER_LAUNCHER ${launcher} PARENT_SCOPE)
  endif()
endfunction()
