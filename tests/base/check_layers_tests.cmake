# The static boundary check (ARCHITECTURE.md rule 1) and the format check.
# See docs/design/boundary-checks.md.

# The script's own behaviour, on small planted trees.
kc_test(NAME kc_check_layers_test LABELS unit
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/check_layers_test.cc LIBS kc_base)
target_compile_definitions(kc_check_layers_test PRIVATE
  KC_CHECK_LAYERS="${PROJECT_SOURCE_DIR}/tools/check_layers")

# The real tree: the suite fails on any upward or private include.
add_test(NAME check_layers.repo
  COMMAND ${PROJECT_SOURCE_DIR}/tools/check_layers --root ${PROJECT_SOURCE_DIR})
set_tests_properties(check_layers.repo PROPERTIES LABELS unit)

# clang-format over every tracked or untracked-but-not-ignored C++ file.
add_test(NAME format.check COMMAND ${PROJECT_SOURCE_DIR}/tools/format
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(format.check PROPERTIES LABELS lint)
