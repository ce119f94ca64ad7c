#include "server/web_ui.h"

#include <fmt/format.h>
#include <httplib.h>

#include <fstream>
#include <sstream>

namespace xpert::server {

namespace {

// Only these files are served: a fixed table, so no request names a path on disk.
struct WebAsset {
  const char* url;
  const char* path;  // where the Debian package installs it
  const char* content_type;
  const char* package;
};

constexpr WebAsset kWebAssets[] = {
    {"/web/marked.min.js", "/usr/share/javascript/marked/marked.min.js", "text/javascript; charset=utf-8",
     "libjs-marked"},
    {"/web/purify.min.js", "/usr/share/nodejs/dompurify/dist/purify.min.js", "text/javascript; charset=utf-8",
     "node-dompurify"},
    {"/web/highlight.min.js", "/usr/share/javascript/highlight.js/highlight.min.js",
     "text/javascript; charset=utf-8", "libjs-highlight.js"},
    {"/web/highlight.css", "/usr/share/javascript/highlight.js/styles/github.css", "text/css; charset=utf-8",
     "libjs-highlight.js"},
};

const WebAsset* find_asset(std::string_view url) {
  for (const WebAsset& a : kWebAssets)
    if (url == a.url) return &a;
  return nullptr;
}

}  // namespace

std::optional<WebAssetFile> read_web_asset(std::string_view url, const std::string& root) {
  const WebAsset* a = find_asset(url);
  if (!a) return std::nullopt;
  std::ifstream f(root + a->path, std::ios::binary);
  if (!f) return std::nullopt;
  std::ostringstream body;
  body << f.rdbuf();
  if (f.bad()) return std::nullopt;
  return WebAssetFile{std::move(body).str(), a->content_type};
}

void add_web_ui_routes(httplib::Server& http) {
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(web_chat_html()), "text/html; charset=utf-8");
  });
  for (const WebAsset& a : kWebAssets) {
    // Read at each request: installing or removing the package takes effect without a restart.
    http.Get(a.url, [&a](const httplib::Request&, httplib::Response& res) {
      if (std::optional<WebAssetFile> f = read_web_asset(a.url)) {
        res.set_header("Cache-Control", "no-cache");
        res.set_content(std::move(f->body), f->content_type);
      } else {
        res.status = 404;
        res.set_content(
            fmt::format("{} is missing: install the Debian package {} (scripts/setup.sh); the chat "
                        "page shows plain text without it\n",
                        a.path, a.package),
            "text/plain; charset=utf-8");
      }
    });
  }
}

}  // namespace xpert::server
