// The translation unit that owns the shared precompiled headers (CMakeLists.txt: ds41_pch_lib,
// ds41_pch_test). It compiles nothing of its own.
