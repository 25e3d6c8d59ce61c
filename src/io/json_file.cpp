// Strict JSON reading: duplicate keys and absurd nesting are rejected while parsing, through
// nlohmann's parse callback (the parser itself is iterative, so deep input cannot overflow the
// stack before the depth check fires).
#include "io/json_file.h"

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <vector>

#include "util/error.h"

namespace forja::io {

nlohmann::json parse_json_strict(std::string_view text, const std::string& file, int max_depth) {
  using json = nlohmann::json;
  // One set of keys per open object; arrays push an empty set to keep the depth count.
  std::vector<std::set<std::string>> open;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (static_cast<int>(open.size()) >= max_depth)
          throw UserError(file + ": JSON nested deeper than " + std::to_string(max_depth) +
                          " levels, which no valid file of this kind has; the file is corrupt");
        open.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open.empty() && !open.back().insert(key).second)
          throw UserError(file + ": duplicate key \"" + key + "\"" +
                          (open.size() == 1
                               ? std::string(" at the top level")
                               : " inside an object at depth " + std::to_string(open.size())) +
                          "; each name may appear once: the file is corrupt or was edited by hand");
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e999
    throw UserError(file + ": not valid JSON (" + e.what() + "); fix or re-download the file");
  }
}

std::string read_text_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError(path.string() + ": is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw UserError(path.string() + ": cannot open the file; check the path and permissions");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw UserError(path.string() + ": read error; check the disk and the file");
  return buffer.str();
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  return parse_json_strict(read_text_file(path), path.string());
}

}  // namespace forja::io
