# Compiles src/kernels/*.comp to SPIR-V and embeds it in a target.
#
# A .comp file names its variants in lines of the form
#   //! variant NAME [-DDEFINE[=VALUE] ...] [requires=nv_coopmat|khr_coopmat|nv_coopmat2]
# (none: one variant named after the file). Each variant is compiled, checked with spirv-val (a
# shader error fails the build) and embedded (kernels/spirv.h); cmake/kernel_table.cpp reads the
# interface of each from its SPIR-V into the generated kernels/kernel_table.h, where the C++ side
# finds the variant as forja::kernels::NAME (kernels/kernel.h).
#
# Two compilers: Debian's glslc (SPIR-V for Vulkan 1.2) for everything it knows, and a glslang
# >= 15 built from Debian's source by scripts/shader_tools (SPIR-V for Vulkan 1.3, validated by
# the spirv-val built beside it) for the variants that need GL_KHR_cooperative_matrix or
# GL_NV_cooperative_matrix2. Each extension is probed; variants that need a feature the probe did
# not find are left out, and the C++ side sees FORJA_HAVE_NV_COOPMAT / FORJA_HAVE_KHR_COOPMAT /
# FORJA_HAVE_NV_COOPMAT2 only when they were built.

find_program(GLSLC glslc REQUIRED)
find_program(SPIRV_VAL spirv-val REQUIRED)
set(FORJA_SPIRV_ENV vulkan1.2)
set(FORJA_SPIRV_ENV_NEW vulkan1.3)

# The newest tool of the given kind in scripts/shader_tools' cache (empty when none).
function(forja_find_built_tool result package tool)
  set(roots "")
  if(DEFINED ENV{FORJA_TOOLS_DIR})
    list(APPEND roots "$ENV{FORJA_TOOLS_DIR}")
  endif()
  if(DEFINED ENV{XDG_CACHE_HOME})
    list(APPEND roots "$ENV{XDG_CACHE_HOME}/forja/tools")
  endif()
  if(DEFINED ENV{HOME})
    list(APPEND roots "$ENV{HOME}/.cache/forja/tools")
  endif()
  set(found "")
  foreach(root ${roots})
    file(GLOB candidates "${root}/${package}-*/bin/${tool}")
    if(candidates)
      list(SORT candidates COMPARE NATURAL ORDER DESCENDING)
      list(GET candidates 0 found)
      break()
    endif()
  endforeach()
  set(${result} "${found}" PARENT_SCOPE)
endfunction()

# Looked up at every configure (a cached empty result would hide tools built later); setting
# FORJA_GLSLANG / FORJA_SPIRV_VAL_NEW on the command line picks others.
if(NOT FORJA_GLSLANG)
  forja_find_built_tool(FORJA_GLSLANG glslang glslang)
endif()
if(NOT FORJA_SPIRV_VAL_NEW)
  forja_find_built_tool(FORJA_SPIRV_VAL_NEW spirv-tools spirv-val)
endif()
if(FORJA_GLSLANG AND FORJA_SPIRV_VAL_NEW)
  message(STATUS "glslang for the new kernel families: ${FORJA_GLSLANG}, validated by ${FORJA_SPIRV_VAL_NEW}")
else()
  message(STATUS "no glslang >= 15 / spirv-val from scripts/shader_tools: KHR and NV2 kernels are not built")
endif()

# ---- compiler probes ----------------------------------------------------------------------
function(forja_probe_glslc result extension body)
  set(dir ${CMAKE_BINARY_DIR}/glslc_probe)
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${dir}/${result}.comp "#version 450\n#extension ${extension} : require\n${body}\n")
  execute_process(COMMAND ${GLSLC} --target-env=${FORJA_SPIRV_ENV} ${dir}/${result}.comp
                          -o ${dir}/${result}.spv
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0)
    set(${result} ON PARENT_SCOPE)
    message(STATUS "glslc supports ${extension}")
  else()
    set(${result} OFF PARENT_SCOPE)
    message(STATUS "glslc does not support ${extension}: those kernel variants are not built")
  endif()
endfunction()

forja_probe_glslc(FORJA_HAVE_NV_COOPMAT GL_NV_cooperative_matrix
  "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 32) in;
void main() { fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> c = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0); }")

# The same with the glslang of scripts/shader_tools, checked by its spirv-val.
function(forja_probe_glslang result extension body)
  set(${result} OFF PARENT_SCOPE)
  if(NOT FORJA_GLSLANG OR NOT FORJA_SPIRV_VAL_NEW)
    return()
  endif()
  set(dir ${CMAKE_BINARY_DIR}/glslc_probe)
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${dir}/${result}.comp "#version 450\n#extension ${extension} : require\n${body}\n")
  execute_process(COMMAND ${FORJA_GLSLANG} -V --target-env ${FORJA_SPIRV_ENV_NEW} -S comp --quiet
                          ${dir}/${result}.comp -o ${dir}/${result}.spv
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0)
    execute_process(COMMAND ${FORJA_SPIRV_VAL_NEW} --target-env ${FORJA_SPIRV_ENV_NEW} ${dir}/${result}.spv
                    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  endif()
  if(rc EQUAL 0)
    set(${result} ON PARENT_SCOPE)
    message(STATUS "glslang supports ${extension}")
  else()
    message(STATUS "glslang does not support ${extension}: those kernel variants are not built")
  endif()
endfunction()

set(forja_khr_probe "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 32) in;
void main() { coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0); }")
forja_probe_glslang(FORJA_HAVE_KHR_COOPMAT GL_KHR_cooperative_matrix "${forja_khr_probe}")
forja_probe_glslang(FORJA_HAVE_NV_COOPMAT2 GL_NV_cooperative_matrix2
  "#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 256) in;
layout(set = 0, binding = 0) buffer B { float16_t x[]; };
void main() {
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> t = createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  t = setTensorLayoutDimensionNV(t, 64, 64);
  coopmat<float16_t, gl_ScopeWorkgroup, 64, 64, gl_MatrixUseA> a;
  coopMatLoadTensorNV(a, x, 0, sliceTensorLayoutNV(t, 0, 64, 0, 64));
}")

# ---- compile and embed ----------------------------------------------------------------------
function(forja_embed_shaders target kernel_dir)
  file(GLOB sources CONFIGURE_DEPENDS ${kernel_dir}/*.comp)
  set(spv_dir ${CMAKE_BINARY_DIR}/spirv)
  file(MAKE_DIRECTORY ${spv_dir})
  set(all_spv "")
  set(all_names "")
  set(table_args "")  # NAME=SPV for each built variant, NAME= for each left out
  foreach(src ${sources})
    get_filename_component(stem ${src} NAME_WE)
    file(STRINGS ${src} lines REGEX "^//! variant ")
    if(NOT lines)
      set(lines "//! variant ${stem}")
    endif()
    foreach(line ${lines})
      string(REGEX REPLACE "^//! variant +" "" spec "${line}")
      string(REGEX REPLACE " +" ";" spec "${spec}")
      list(POP_FRONT spec name)
      set(defines "")
      set(skip OFF)
      set(new_compiler OFF)
      foreach(item ${spec})
        if(item STREQUAL "requires=nv_coopmat")
          if(NOT FORJA_HAVE_NV_COOPMAT)
            set(skip ON)
          endif()
        elseif(item STREQUAL "requires=khr_coopmat")
          if(NOT FORJA_HAVE_KHR_COOPMAT)
            set(skip ON)
          endif()
          set(new_compiler ON)
        elseif(item STREQUAL "requires=nv_coopmat2")
          if(NOT FORJA_HAVE_NV_COOPMAT2)
            set(skip ON)
          endif()
          set(new_compiler ON)
        else()
          list(APPEND defines ${item})
        endif()
      endforeach()
      if(name IN_LIST all_names)
        message(FATAL_ERROR "shader variant ${name} is declared twice (${src})")
      endif()
      list(APPEND all_names ${name})
      if(skip)
        list(APPEND table_args "${name}=")
        continue()
      endif()
      set(spv ${spv_dir}/${name}.spv)
      if(new_compiler)
        # glslang's output as is: the drivers optimise after specialization anyway.
        add_custom_command(
          OUTPUT ${spv}
          COMMAND ${FORJA_GLSLANG} -V --target-env ${FORJA_SPIRV_ENV_NEW} -S comp --quiet
                  -I${kernel_dir} ${defines} --depfile ${spv}.d ${src} -o ${spv}
          COMMAND ${FORJA_SPIRV_VAL_NEW} --target-env ${FORJA_SPIRV_ENV_NEW} ${spv}
          DEPENDS ${src}
          DEPFILE ${spv}.d
          COMMENT "glslang ${name}"
          VERBATIM)
      else()
        add_custom_command(
          OUTPUT ${spv}
          COMMAND ${GLSLC} --target-env=${FORJA_SPIRV_ENV} -fshader-stage=compute -O
                  -I ${kernel_dir} ${defines} -MD -MF ${spv}.d ${src} -o ${spv}
          COMMAND ${SPIRV_VAL} --target-env ${FORJA_SPIRV_ENV} ${spv}
          DEPENDS ${src}
          DEPFILE ${spv}.d
          COMMENT "glslc ${name}"
          VERBATIM)
      endif()
      list(APPEND all_spv ${spv})
      list(APPEND table_args "${name}=${spv}")
    endforeach()
  endforeach()
  # The build tool that embeds the SPIR-V and writes the kernel table (it reads each module's
  # interface with the program's own reader, gpu/spirv_interface.cpp).
  add_executable(forja_kernel_table ${CMAKE_SOURCE_DIR}/cmake/kernel_table.cpp
                 ${CMAKE_SOURCE_DIR}/src/gpu/spirv_interface.cpp)
  target_include_directories(forja_kernel_table PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(forja_kernel_table PRIVATE ${FORJA_WARNINGS})
  set(generated ${CMAKE_BINARY_DIR}/generated)
  file(MAKE_DIRECTORY ${generated}/kernels)
  set(embedded ${generated}/spirv_embedded.cpp)
  set(table ${generated}/kernels/kernel_table.h)
  add_custom_command(
    OUTPUT ${embedded}
    BYPRODUCTS ${table}
    COMMAND forja_kernel_table ${embedded} ${table} ${table_args}
    DEPENDS ${all_spv} forja_kernel_table
    COMMENT "embedding the SPIR-V kernels and writing kernels/kernel_table.h"
    VERBATIM)
  target_sources(${target} PRIVATE ${embedded} ${table})
  target_include_directories(${target} PUBLIC ${generated})
  if(FORJA_HAVE_NV_COOPMAT)
    target_compile_definitions(${target} PUBLIC FORJA_HAVE_NV_COOPMAT=1)
  endif()
  if(FORJA_HAVE_KHR_COOPMAT)
    target_compile_definitions(${target} PUBLIC FORJA_HAVE_KHR_COOPMAT=1)
  endif()
  if(FORJA_HAVE_NV_COOPMAT2)
    target_compile_definitions(${target} PUBLIC FORJA_HAVE_NV_COOPMAT2=1)
  endif()
endfunction()
