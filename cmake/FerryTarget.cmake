# Flags every Ferry target builds with.
function(ferry_warnings target)
  # GCC 12 reports array-bounds false positives inside c10's inline tuple storage.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror -Wno-array-bounds)
endfunction()

# Shares the torch precompiled header of ferry_pch with `target` and applies our warnings.
function(ferry_target target)
  ferry_warnings(${target})
  target_precompile_headers(${target} REUSE_FROM ferry_pch)
  target_link_libraries(${target} PRIVATE ferry_pch)
endfunction()
