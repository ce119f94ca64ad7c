// Python str semantics on UTF-8 text (code points, Unicode whitespace), shared by filters and methods.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace xpert::jinja::pystr {

bool is_space(std::string_view ch);  // one code point, as str.isspace()
// str.strip / lstrip / rstrip; `chars` null means whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit); sep null splits on runs of whitespace.
std::vector<std::string> split(std::string_view s, const std::string* sep, long maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string& sep, long maxsplit);
std::string replace(std::string_view s, std::string_view from, std::string_view to, long count);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string py_title(std::string_view s);     // str.title()
std::string jinja_title(std::string_view s);  // the `title` filter (words split at whitespace and -({[<)
std::string capitalize(std::string_view s);
// str.find / rfind, in code points; -1 when absent.
long find(std::string_view s, std::string_view sub, bool reverse);
std::string html_escape(std::string_view s);

}  // namespace xpert::jinja::pystr
