# Warning flags for every Kuangchao target (kc_set_warnings is called by kc_layer and friends).
function(kc_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow
    -Wnon-virtual-dtor -Wimplicit-fallthrough)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  if(KC_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
