# Compiles src/kernels/*.comp to SPIR-V and embeds it in a target.
#
# A .comp file names its variants in lines of the form
#   //! variant NAME [-DDEFINE[=VALUE] ...] [requires=nv_coopmat|khr_coopmat]
# (none: one variant named after the file). Each variant is compiled with glslc, checked with
# spirv-val (a shader error fails the build) and embedded as forja::kernels::spirv("NAME").
# Variants that need a compiler feature the probe did not find are left out, and the C++ side
# sees FORJA_HAVE_NV_COOPMAT / FORJA_HAVE_KHR_COOPMAT only when they were built.

find_program(GLSLC glslc REQUIRED)
find_program(SPIRV_VAL spirv-val REQUIRED)
set(FORJA_SPIRV_ENV vulkan1.2)

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
forja_probe_glslc(FORJA_HAVE_KHR_COOPMAT GL_KHR_cooperative_matrix
  "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 32) in;
void main() { coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0); }")

# ---- compile and embed ----------------------------------------------------------------------
function(forja_embed_shaders target kernel_dir)
  file(GLOB sources CONFIGURE_DEPENDS ${kernel_dir}/*.comp)
  set(spv_dir ${CMAKE_BINARY_DIR}/spirv)
  file(MAKE_DIRECTORY ${spv_dir})
  set(all_spv "")
  set(all_names "")
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
      foreach(item ${spec})
        if(item STREQUAL "requires=nv_coopmat")
          if(NOT FORJA_HAVE_NV_COOPMAT)
            set(skip ON)
          endif()
        elseif(item STREQUAL "requires=khr_coopmat")
          if(NOT FORJA_HAVE_KHR_COOPMAT)
            set(skip ON)
          endif()
        else()
          list(APPEND defines ${item})
        endif()
      endforeach()
      if(skip)
        continue()
      endif()
      if(name IN_LIST all_names)
        message(FATAL_ERROR "shader variant ${name} is declared twice (${src})")
      endif()
      set(spv ${spv_dir}/${name}.spv)
      add_custom_command(
        OUTPUT ${spv}
        COMMAND ${GLSLC} --target-env=${FORJA_SPIRV_ENV} -fshader-stage=compute -O
                -I ${kernel_dir} ${defines} -MD -MF ${spv}.d ${src} -o ${spv}
        COMMAND ${SPIRV_VAL} --target-env ${FORJA_SPIRV_ENV} ${spv}
        DEPENDS ${src}
        DEPFILE ${spv}.d
        COMMENT "glslc ${name}"
        VERBATIM)
      list(APPEND all_spv ${spv})
      list(APPEND all_names ${name})
    endforeach()
  endforeach()
  set(embedded ${CMAKE_BINARY_DIR}/generated/spirv_embedded.cpp)
  add_custom_command(
    OUTPUT ${embedded}
    COMMAND ${CMAKE_COMMAND} -DOUT=${embedded} "-DNAMES=${all_names}" -DSPV_DIR=${spv_dir}
            -P ${CMAKE_SOURCE_DIR}/cmake/embed_spirv.cmake
    DEPENDS ${all_spv} ${CMAKE_SOURCE_DIR}/cmake/embed_spirv.cmake
    COMMENT "embedding ${CMAKE_MATCH_COUNT} SPIR-V kernels"
    VERBATIM)
  target_sources(${target} PRIVATE ${embedded})
  if(FORJA_HAVE_NV_COOPMAT)
    target_compile_definitions(${target} PUBLIC FORJA_HAVE_NV_COOPMAT=1)
  endif()
  if(FORJA_HAVE_KHR_COOPMAT)
    target_compile_definitions(${target} PUBLIC FORJA_HAVE_KHR_COOPMAT=1)
  endif()
endfunction()
