# Warnings stop the build here; with another compiler or LibTorch than Debian 12's, a new warning
# in their headers need not (-DFERRY_WERROR=OFF).
option(FERRY_WERROR "Treat compiler warnings as errors" ON)

# Each target's sources compile in batches, one translation unit per batch: LibTorch's headers and
# the templates every file instantiates from them are parsed and compiled once per batch instead of
# once per file. Configure with -DFERRY_UNITY=OFF to compile file by file (a change then rebuilds
# one file, not its batch).
option(FERRY_UNITY "Compile each target's sources in batches of FERRY_UNITY_BATCH files" ON)
set(FERRY_UNITY_BATCH 16 CACHE STRING "Most source files in one batch of a unity build")

# Flags every Ferry target builds with.
function(ferry_warnings target)
  # GCC 12 reports array-bounds false positives inside c10's inline tuple storage.
  target_compile_options(${target} PRIVATE -Wall -Wextra $<$<BOOL:${FERRY_WERROR}>:-Werror>
    -Wno-array-bounds)
  # A unity batch includes its source files, and GCC then takes a class of one of them with a
  # member of an anonymous namespace's type for a header's; compiled file by file it warns truly.
  if(FERRY_UNITY)
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endif()
endfunction()

# The LibTorch headers that gather most of it (<torch/torch.h>, <torch/all.h>, the nn modules): a
# translation unit that reaches one of them parses less with the precompiled header than without.
# One that reaches only ATen's tensor, IValue, autograd or optimizer headers parses those faster
# than it loads the precompiled header, which is as big as all of LibTorch's API.
set(FERRY_WHOLE_TORCH_INCLUDE "^[ \t]*#[ \t]*include[ \t]*<torch/(torch\\.h|all\\.h|nn[/.])")
file(GLOB FERRY_INCLUDE_ROOTS LIST_DIRECTORIES true ${PROJECT_SOURCE_DIR}/*/include)
list(APPEND FERRY_INCLUDE_ROOTS ${PROJECT_SOURCE_DIR})

# Sets `out` to whether `file`, or a header of this project it includes (through any number of
# others), includes one of those headers. Each file is read once per configure.
function(ferry_reaches_whole_torch file out)
  string(MD5 key "${file}")
  get_property(known GLOBAL PROPERTY ferry_whole_torch_${key} SET)
  if(known)
    get_property(reaches GLOBAL PROPERTY ferry_whole_torch_${key})
    set(${out} ${reaches} PARENT_SCOPE)
    return()
  endif()
  # Marked first, so that headers that include each other end the walk.
  set_property(GLOBAL PROPERTY ferry_whole_torch_${key} OFF)
  file(STRINGS "${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  get_filename_component(here "${file}" DIRECTORY)
  set(reaches OFF)
  foreach(line IN LISTS includes)
    if(line MATCHES "${FERRY_WHOLE_TORCH_INCLUDE}")
      set(reaches ON)
      break()
    endif()
    if(NOT line MATCHES "include[ \t]*[<\"]([^>\"]+)[>\"]")
      continue()
    endif()
    set(name "${CMAKE_MATCH_1}")
    foreach(root IN LISTS here FERRY_INCLUDE_ROOTS)
      if(EXISTS "${root}/${name}" AND NOT IS_DIRECTORY "${root}/${name}")
        ferry_reaches_whole_torch("${root}/${name}" reaches)
        break()
      endif()
    endforeach()
    if(reaches)
      break()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY ferry_whole_torch_${key} ${reaches})
  set(${out} ${reaches} PARENT_SCOPE)
endfunction()

# Applies our warnings to `target`, and shares the torch precompiled header of ferry_pch with those
# of its sources that reach the whole of LibTorch's API; the others compile without it. In a unity
# build the two kinds go to batches of their own.
function(ferry_target target)
  ferry_warnings(${target})
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(whole "")
  set(light "")
  foreach(source IN LISTS sources)
    get_filename_component(path "${source}" ABSOLUTE BASE_DIR "${source_dir}")
    # Generated sources (Cap'n Proto's) include no LibTorch.
    set(reaches OFF)
    if(EXISTS "${path}")
      ferry_reaches_whole_torch("${path}" reaches)
    endif()
    if(reaches)
      list(APPEND whole "${source}")
    else()
      list(APPEND light "${source}")
      set_source_files_properties("${source}" TARGET_DIRECTORY ${target}
        PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
  if(FERRY_UNITY)
    ferry_unity_batches(${target} whole "${whole}")
    ferry_unity_batches(${target} light "${light}")
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
  endif()
  target_precompile_headers(${target} REUSE_FROM ferry_pch)
  # Only while building: an installed library needs no precompiled header.
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:ferry_pch>)
endfunction()

# Puts the C++ files of `sources` into as few batches of `target` named `kind`0, `kind`1, ... as
# FERRY_UNITY_BATCH allows, of equal sizes, in their order. A light batch loads no precompiled
# header.
function(ferry_unity_batches target kind sources)
  list(FILTER sources INCLUDE REGEX "\\.(cc|cpp|cxx)$")
  list(LENGTH sources count)
  if(count EQUAL 0)
    return()
  endif()
  math(EXPR batches "(${count} + ${FERRY_UNITY_BATCH} - 1) / ${FERRY_UNITY_BATCH}")
  get_target_property(binary_dir ${target} BINARY_DIR)
  set(index 0)
  foreach(source IN LISTS sources)
    math(EXPR batch "${index} * ${batches} / ${count}")
    math(EXPR index "${index} + 1")
    set_source_files_properties("${source}" TARGET_DIRECTORY ${target}
      PROPERTIES UNITY_GROUP "${kind}${batch}")
    if(kind STREQUAL "light")
      # The batch's own file, where CMake (3.18 to 3.25 at least) will write it: marked before it
      # exists. Should a CMake write it elsewhere, the batch only loads the header in vain.
      set_source_files_properties(
        "${binary_dir}/CMakeFiles/${target}.dir/Unity/unity_${kind}${batch}_cxx.cxx"
        TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
endfunction()

# Plugins (ferry/remote_module/stage_plugin.h) call the core, rpc and remote_module functions of
# the program that loads them: a program that loads plugins exports all of them.
function(ferry_plugin_host target)
  set_target_properties(${target} PROPERTIES ENABLE_EXPORTS ON)
  target_link_options(${target} PRIVATE "LINKER:--whole-archive" $<TARGET_FILE:ferry_remote_module>
    $<TARGET_FILE:ferry_rpc> $<TARGET_FILE:ferry_core> $<TARGET_FILE:ferry_core_base>
    "LINKER:--no-whole-archive")
endfunction()
