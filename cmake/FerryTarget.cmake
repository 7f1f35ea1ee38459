# Warnings stop the build here; with another compiler or LibTorch than Debian 12's, a new warning
# in their headers need not (-DFERRY_WERROR=OFF).
option(FERRY_WERROR "Treat compiler warnings as errors" ON)

# Flags every Ferry target builds with.
function(ferry_warnings target)
  # GCC 12 reports array-bounds false positives inside c10's inline tuple storage.
  target_compile_options(${target} PRIVATE -Wall -Wextra $<$<BOOL:${FERRY_WERROR}>:-Werror>
    -Wno-array-bounds)
endfunction()

# Shares the torch precompiled header of ferry_pch with `target` and applies our warnings.
function(ferry_target target)
  ferry_warnings(${target})
  target_precompile_headers(${target} REUSE_FROM ferry_pch)
  # Only while building: an installed library needs no precompiled header.
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:ferry_pch>)
endfunction()

# Plugins (ferry/remote_module/stage_plugin.h) call the core, rpc and remote_module functions of
# the program that loads them: a program that loads plugins exports all of them.
function(ferry_plugin_host target)
  set_target_properties(${target} PROPERTIES ENABLE_EXPORTS ON)
  target_link_options(${target} PRIVATE "LINKER:--whole-archive" $<TARGET_FILE:ferry_remote_module>
    $<TARGET_FILE:ferry_rpc> $<TARGET_FILE:ferry_core> $<TARGET_FILE:ferry_core_base>
    "LINKER:--no-whole-archive")
endfunction()
