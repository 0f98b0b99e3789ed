# The include rule of the layers (docs/architecture.md): a file may include headers of its own
# layer and of the layers below it, never above or beside it. CTest runs it ("layers: ...");
# by hand:   cmake -DSOURCE_DIR=. -P cmake/check_layers.cmake
# With -DSELF_TEST=ON it checks itself instead: on a small tree with one upward and one sideways
# include it must report exactly those two.
#
#   layer         may include
#   core, cuda    core/, cuda/                         (cuda/ is core's GPU backend)
#   autograd      core/, autograd/
#   nn            core/, autograd/, nn/
#   optim         core/, autograd/, optim/
#   training      core/, autograd/, nn/, optim/, training/
#   data          core/, autograd/, data/
#   dist          core/, autograd/, dist/
#   apps/common   every layer above, apps/common/
#   apps/<app>    every layer above, apps/common/, apps/<app>/
# cuda/memory.h is core's public device interface (allocator, copies, streams), so every layer may
# include it; the rest of cuda/ is private to the backend. attograd.h (every layer in one include)
# is for apps. tests/, bench/, tools/ and examples/ may include anything. System and library
# headers (<...>) are not checked.
cmake_minimum_required(VERSION 3.25)

set(allowed_core core cuda)
set(allowed_cuda core cuda)
set(allowed_autograd core autograd)
set(allowed_nn core autograd nn)
set(allowed_optim core autograd optim)
set(allowed_training core autograd nn optim training)
set(allowed_data core autograd data)
set(allowed_dist core autograd dist)
set(allowed_apps core autograd nn optim training data dist apps/common)
set(checked_layers core cuda autograd nn optim training data dist apps)

# Appends "file:line: includes "x": <layer> may include only ..." to the list named by out_var.
function(check_tree root out_var)
  set(found "")
  foreach(layer ${checked_layers})
    file(GLOB_RECURSE files RELATIVE ${root} ${root}/${layer}/*.h ${root}/${layer}/*.cpp ${root}/${layer}/*.cu
         ${root}/${layer}/*.cuh)
    foreach(f ${files})
      set(allowed ${allowed_${layer}})
      if(layer STREQUAL "apps" AND f MATCHES "^apps/([^/]+)/")
        list(APPEND allowed apps/${CMAKE_MATCH_1})  # an app's own folder
      endif()
      if(f MATCHES "^apps/[^/]+$")  # a file directly in apps/: one app of its own
        list(APPEND allowed ${f})
      endif()
      file(STRINGS ${root}/${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
      foreach(line ${lines})
        string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" inc "${line}")
        if(inc STREQUAL "cuda/memory.h" OR (inc STREQUAL "attograd.h" AND layer STREQUAL "apps"))
          continue()  # core's device interface; the one-include header of the library, for apps
        endif()
        set(ok FALSE)
        foreach(a ${allowed})
          string(LENGTH "${a}/" n)
          string(SUBSTRING "${inc}" 0 ${n} head)
          if(head STREQUAL "${a}/" OR inc STREQUAL a)
            set(ok TRUE)
          endif()
        endforeach()
        if(NOT ok)
          list(JOIN allowed ", " allowed_str)
          list(APPEND found "${f}: includes \"${inc}\": ${layer} may include only ${allowed_str} (and cuda/memory.h)")
        endif()
      endforeach()
    endforeach()
  endforeach()
  set(${out_var} "${found}" PARENT_SCOPE)
endfunction()

if(SELF_TEST)
  set(root ${CMAKE_CURRENT_BINARY_DIR}/check_layers_self_test)
  file(REMOVE_RECURSE ${root})
  file(WRITE ${root}/core/tensor.cpp "#include \"core/tensor.h\"\n#include \"cuda/memory.h\"\n")
  file(WRITE ${root}/core/bad.cpp "#include \"core/tensor.h\"\n  #include \"autograd/tape.h\"  // up\n")
  file(WRITE ${root}/nn/ok.cpp "#include \"autograd/ops.h\"\n#include <vector>\n")
  file(WRITE ${root}/data/bad.cpp "#include \"dist/dist.h\"\n")
  file(WRITE ${root}/autograd/bad.cpp "#include \"cuda/common.cuh\"\n")
  file(WRITE ${root}/apps/gpt/main.cpp "#include \"apps/gpt/model.h\"\n#include \"apps/common/run.h\"\n")
  file(WRITE ${root}/apps/gpt/bad.cpp "#include \"apps/vit/model.h\"\n")
  file(WRITE ${root}/nn/bad.h "#include \"attograd.h\"\n")
  check_tree(${root} found)
  file(REMOVE_RECURSE ${root})
  set(expected "core/bad.cpp: includes \"autograd/tape.h\"" "data/bad.cpp: includes \"dist/dist.h\""
               "autograd/bad.cpp: includes \"cuda/common.cuh\"" "apps/gpt/bad.cpp: includes \"apps/vit/model.h\""
               "nn/bad.h: includes \"attograd.h\"")
  list(LENGTH found n)
  list(LENGTH expected n_expected)
  if(NOT n EQUAL n_expected)
    list(JOIN found "\n  " s)
    message(FATAL_ERROR "check_layers self test: expected ${n_expected} violations, found ${n}:\n  ${s}")
  endif()
  foreach(e ${expected})
    string(FIND "${found}" "${e}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "check_layers self test: '${e}' was not reported")
    endif()
  endforeach()
  message(STATUS "check_layers self test: the ${n} planted violations were reported")
  return()
endif()

if(NOT SOURCE_DIR)
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=<attograd root> -P cmake/check_layers.cmake")
endif()
get_filename_component(SOURCE_DIR "${SOURCE_DIR}" ABSOLUTE)
check_tree(${SOURCE_DIR} found)
if(found)
  list(LENGTH found n)
  list(JOIN found "\n  " s)
  message(FATAL_ERROR "${n} include(s) run up or across the layers (docs/architecture.md):\n  ${s}")
endif()
message(STATUS "layers: every include follows the layers")
