# Run at llama.cpp's project() call (CMAKE_PROJECT_llama.cpp_INCLUDE, set by scripts/install_llama_cpp.py): turns
# llama.cpp's `common` library off again after llama-cpp-python forced it on (CACHE FORCE). Its Python bindings load
# libllama and libggml* only; `common` (chat parsers, JSON schemas, httplib) was ~57 of the 127 objects compiled.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library (not used by llama-cpp-python's bindings)" FORCE)
