# The kc binary end to end: exit codes, messages, settings.
kc_test(NAME kc_cli_test LABELS integration
        SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/cli_test.cc
        LIBS kc_base)
target_compile_definitions(kc_cli_test PRIVATE KC_BINARY="$<TARGET_FILE:kc>")
add_dependencies(kc_cli_test kc)
