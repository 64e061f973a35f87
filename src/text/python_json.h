// ds41 text: JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it,
// which is what the official V4.1 encoder uses for tool schemas, response formats and non-string
// tool-call arguments (MODEL_SPEC 6.2). Owns that one serialisation: separators ", " and ": ",
// keys in insertion order, non-ASCII kept raw, control characters as \uXXXX (lower-case hex)
// except \b \f \n \r \t, floats as Python's repr() (shortest round trip; exponent form below
// 1e-4 and from 1e16 on, e.g. 1e-05, 1e+16; integral floats keep ".0").
//
// Known difference: integers beyond 64 bits were already turned into doubles by the JSON
// parser (nlohmann), whereas Python keeps them exact.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ds41::text {

std::string python_json_dumps(const nlohmann::ordered_json& v);
// repr() of a Python float.
std::string python_float_repr(double x);

}  // namespace ds41::text
