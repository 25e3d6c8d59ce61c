// Reading the JSON files of a model directory (config.json, model.safetensors.index.json,
// adapter_config.json, safetensors headers) strictly: a duplicated key is an error, because
// nlohmann::json (like Python's json) would silently keep the last value and hide a corrupt or
// hand-edited file.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace forja::io {

// Parses `text`; throws UserError naming `file` on invalid JSON, invalid UTF-8, a duplicated key
// in any object, or nesting deeper than `max_depth` (objects and arrays).
nlohmann::json parse_json_strict(std::string_view text, const std::string& file,
                                 int max_depth = 64);

// Reads a whole file; throws UserError naming it when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

// read_text_file + parse_json_strict.
nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace forja::io
