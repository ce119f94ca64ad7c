// The chat page at GET / and the Debian-packaged JavaScript it loads from /web/ (Markdown, sanitizer,
// highlighting), read from where Debian installs it at each request; absent files are a 404 and the page
// falls back to plain text.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace httplib {
class Server;
}

namespace xpert::server {

// The page's bytes (src/server/web_ui.html, embedded at build time).
std::string_view web_chat_html();

struct WebAssetFile {
  std::string body;
  const char* content_type;
};

// The file behind a /web/ URL, read under `root` (a prefix to the absolute Debian paths; "" in the server,
// a test folder in tests). nullopt when the URL is not one of the page's files or the file is absent.
std::optional<WebAssetFile> read_web_asset(std::string_view url, const std::string& root = "");

// GET / and GET /web/<file> on `http`.
void add_web_ui_routes(httplib::Server& http);

}  // namespace xpert::server
