// Escaping for text that goes into HTML (element content and double- or single-quoted attribute
// values): run names, paths, device names and config files come from outside and may hold any
// character, so every such string passes through html_escape before it reaches a page.
#pragma once
#include <string>
#include <string_view>

namespace forja {

inline std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace forja
