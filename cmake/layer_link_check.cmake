# The call rule of the layers (docs/architecture.md): a layer calls only the layers below it.
#
#   attograd_layer_link_check(<program> <library>)
#
# adds <program>, which links <library> WHOLE (every object, used or not) and, through its PUBLIC
# links, only the layers below it. A call from <library> into a layer above it is then an
# undefined reference there, and the build stops naming the symbol. Without WHOLE the linker would
# take only the objects the program uses (none: it is an empty main), and find nothing. The program
# does nothing and is never run. CMakeLists.txt adds one per layer ("layer link checks").
#
# With -DSELF_TEST=ON, as a script (cmake -DSELF_TEST=ON -P cmake/layer_link_check.cmake), it
# checks itself on a small project of two layers built in WORK_DIR (default: the current directory's
# layer_link_self_test/, removed afterwards): "lower", and "upper" above it; a copy of lower with
# one object that calls upper must fail to link, naming upper's function, while lower and upper
# link; and that copy links without WHOLE, which is why the check uses it. CXX and GENERATOR name
# the compiler and the CMake generator (defaults: CMake's own choice).
if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.25)  # LINK_LIBRARY:WHOLE_ARCHIVE: 3.24
endif()

function(attograd_layer_link_check program library)
  set(main ${CMAKE_CURRENT_BINARY_DIR}/layer_check_main.cpp)
  file(CONFIGURE OUTPUT ${main} CONTENT "int main() { return 0; }\n")
  add_executable(${program} ${main})
  target_link_libraries(${program} PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,${library}>")
endfunction()

if(NOT CMAKE_SCRIPT_MODE_FILE OR NOT SELF_TEST)
  return()
endif()

if(NOT WORK_DIR)
  set(WORK_DIR ${CMAKE_CURRENT_BINARY_DIR}/layer_link_self_test)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
set(src ${WORK_DIR}/src)
file(WRITE ${src}/lower.cpp "int lower_value() { return 1; }\n")
file(WRITE ${src}/upper.cpp "int lower_value();\nint upper_value() { return lower_value() + 1; }\n")
# called by nothing: only a whole-archive link sees its call upward
file(WRITE ${src}/lower_calls_up.cpp "int upper_value();\nint lower_calls_up() { return upper_value(); }\n")
file(WRITE ${src}/CMakeLists.txt "
cmake_minimum_required(VERSION 3.25)
project(layer_link_self_test LANGUAGES CXX)
include(${CMAKE_CURRENT_LIST_FILE})
add_library(lower STATIC lower.cpp)
add_library(upper STATIC upper.cpp)
target_link_libraries(upper PUBLIC lower)
add_library(lower_planted STATIC lower.cpp lower_calls_up.cpp)
attograd_layer_link_check(check_lower lower)
attograd_layer_link_check(check_upper upper)
attograd_layer_link_check(check_planted lower_planted)
add_executable(plain_link \${CMAKE_CURRENT_BINARY_DIR}/layer_check_main.cpp)
target_link_libraries(plain_link PRIVATE lower_planted)
")

set(configure ${CMAKE_COMMAND} -S ${src} -B ${WORK_DIR}/build)
if(CXX)
  list(APPEND configure -DCMAKE_CXX_COMPILER=${CXX})
endif()
if(GENERATOR)
  list(APPEND configure -G ${GENERATOR})
endif()
execute_process(COMMAND ${configure} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "layer link self test: the test project did not configure:\n${out}")
endif()

# Builds one target of the test project: its exit code in rc_var, its output in out_var.
function(build target rc_var out_var)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build --target ${target} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(${rc_var} ${rc} PARENT_SCOPE)
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

foreach(target check_lower check_upper plain_link)
  build(${target} rc out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "layer link self test: ${target} should link, but failed:\n${out}")
  endif()
endforeach()
build(check_planted rc out)
if(rc EQUAL 0)
  message(FATAL_ERROR "layer link self test: check_planted linked, though lower_planted calls upper_value")
endif()
string(FIND "${out}" "upper_value" at)
if(at EQUAL -1 OR NOT out MATCHES "undefined")
  message(FATAL_ERROR "layer link self test: check_planted failed without naming upper_value as undefined:\n${out}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "layer link self test: the planted upward call failed the link, naming upper_value")
