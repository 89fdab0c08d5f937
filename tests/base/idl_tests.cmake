# The IDL suite (ARCHITECTURE.md rule 4; docs/design/idl.md): option read-back, the ErrorCode
# mirror, and the compiled IDL against the committed review snapshot.
kc_test(NAME kc_idl_test LABELS unit SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/idl_test.cc
  LIBS kc_idl kc_base)
target_compile_definitions(kc_idl_test PRIVATE
  KC_IDL_DESCRIPTOR_SET="$<TARGET_PROPERTY:kc_idl,KC_IDL_DESCRIPTOR_SET>"
  KC_IDL_SNAPSHOT="${PROJECT_SOURCE_DIR}/proto/kc/v1/descriptor_snapshot.txtpb")
# Link every object of kc_idl, not only the ones the test names: a .proto file's descriptors
# and option extensions register themselves from static initialisers, and the test must see
# every file of the IDL, including ones no test code refers to.
target_link_options(kc_idl_test PRIVATE
  "LINKER:--whole-archive" "$<TARGET_FILE:kc_idl>" "LINKER:--no-whole-archive")

# The snapshot must also be byte-for-byte what tools/idl_snapshot writes (a hand edit that
# parses the same still fails here).
add_test(NAME kc_idl_snapshot_is_fresh
  COMMAND ${PROJECT_SOURCE_DIR}/tools/idl_snapshot --check)
set_tests_properties(kc_idl_snapshot_is_fresh PROPERTIES LABELS unit
  ENVIRONMENT "PROTOC=$<TARGET_FILE:protobuf::protoc>")
