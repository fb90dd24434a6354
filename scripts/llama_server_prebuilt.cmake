# Included by scripts/build_llama_server.sh into llama.cpp's top-level CMakeLists.txt (before
# ggml would be added): the ggml, llama and mtmd targets become the shared libraries that
# llama-cpp-python installed (KVPHASE_LLAMA_LIB), so only llama-server, its common library and
# its HTTP layer are compiled, and the server runs the very kernels the in-process backend runs.
foreach(lib ggml-base ggml-cpu ggml llama mtmd)
    if(NOT EXISTS ${KVPHASE_LLAMA_LIB}/lib${lib}.so)
        message(FATAL_ERROR "${KVPHASE_LLAMA_LIB}/lib${lib}.so is missing")
    endif()
    add_library(${lib} SHARED IMPORTED GLOBAL)
    set_target_properties(${lib} PROPERTIES IMPORTED_LOCATION ${KVPHASE_LLAMA_LIB}/lib${lib}.so)
endforeach()
set_target_properties(ggml-base PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${CMAKE_CURRENT_SOURCE_DIR}/ggml/include)
set_target_properties(ggml PROPERTIES INTERFACE_LINK_LIBRARIES "ggml-base;ggml-cpu")
set_target_properties(llama PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${CMAKE_CURRENT_SOURCE_DIR}/include
                      INTERFACE_LINK_LIBRARIES ggml)
set_target_properties(mtmd PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${CMAKE_CURRENT_SOURCE_DIR}/tools/mtmd
                      INTERFACE_LINK_LIBRARIES llama)
