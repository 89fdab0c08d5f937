# Helpers that keep one library per layer and one unit-test binary per layer.
#
# kc_layer(NAME kc_comm BELOW kc_hal [DEPS ...])
#   Builds every *.cc under the calling directory (internal/ and backend subdirectories
#   included) except *_test.cc into a static library NAME that links BELOW publicly.
#   Includes are rooted at src/. A *_test.cc beside the code goes into NAME_test, one
#   GoogleTest binary per layer, registered with ctest under the label `unit`.
function(kc_layer)
  cmake_parse_arguments(KC "" "NAME;BELOW" "DEPS;TEST_DEPS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/*.cc")
  file(GLOB_RECURSE tests CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/*_test.cc")
  list(REMOVE_ITEM srcs ${tests})
  if(srcs)
    add_library(${KC_NAME} STATIC ${srcs})
    set(scope PUBLIC)
  else()
    add_library(${KC_NAME} INTERFACE)
    set(scope INTERFACE)
  endif()
  target_include_directories(${KC_NAME} ${scope} ${PROJECT_SOURCE_DIR}/src)
  if(KC_BELOW)
    target_link_libraries(${KC_NAME} ${scope} ${KC_BELOW})
  endif()
  if(KC_DEPS)
    target_link_libraries(${KC_NAME} ${scope} ${KC_DEPS})
  endif()
  if(srcs)
    kc_set_warnings(${KC_NAME})
  endif()
  if(KC_BUILD_TESTS AND tests)
    add_executable(${KC_NAME}_test ${tests})
    target_link_libraries(${KC_NAME}_test PRIVATE ${KC_NAME} ${KC_TEST_DEPS}
      GTest::gmock GTest::gtest_main)
    target_include_directories(${KC_NAME}_test PRIVATE ${PROJECT_SOURCE_DIR})  # tests/support/
    kc_set_warnings(${KC_NAME}_test)
    gtest_discover_tests(${KC_NAME}_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
  endif()
endfunction()

# kc_test(NAME foo LABELS integration SOURCES a.cc b.cc LIBS kc_comm [SERIAL])
#   A multi-process or cross-layer GoogleTest binary under tests/. SERIAL tests run alone
#   (ctest's RUN_SERIAL): each starts a whole cluster (kcd, an agent, training ranks), and beside
#   another test's ranks on a small machine the agent's heartbeats starve until kcd declares the
#   host lost (the agent's single loop: see docs/operations/agents.md, known limits).
function(kc_test)
  cmake_parse_arguments(KC "SERIAL" "NAME" "LABELS;SOURCES;LIBS" ${ARGN})
  add_executable(${KC_NAME} ${KC_SOURCES})
  target_link_libraries(${KC_NAME} PRIVATE ${KC_LIBS} GTest::gmock GTest::gtest_main)
  target_include_directories(${KC_NAME} PRIVATE ${PROJECT_SOURCE_DIR})  # tests/support/
  kc_set_warnings(${KC_NAME})
  if(KC_SERIAL)
    gtest_discover_tests(${KC_NAME} PROPERTIES LABELS "${KC_LABELS}" RUN_SERIAL TRUE
                         DISCOVERY_TIMEOUT 60)
  else()
    gtest_discover_tests(${KC_NAME} PROPERTIES LABELS "${KC_LABELS}" DISCOVERY_TIMEOUT 60)
  endif()
endfunction()
