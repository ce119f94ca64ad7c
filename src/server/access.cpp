#include "server/access.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>


namespace xpert::server {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}

// "name:port", "[v6]:port", "name" -> the name, lower case, without brackets.
std::string host_name(const std::string& host) {
  std::string h = host;
  if (!h.empty() && h[0] == '[') {
    const size_t e = h.find(']');
    return lower(h.substr(1, e == std::string::npos ? std::string::npos : e - 1));
  }
  const size_t c = h.rfind(':');
  if (c != std::string::npos) h = h.substr(0, c);
  return lower(h);
}

bool is_ip_literal(const std::string& name) {
  unsigned char buf[16];
  return inet_pton(AF_INET, name.c_str(), buf) == 1 || inet_pton(AF_INET6, name.c_str(), buf) == 1;
}

}  // namespace

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    while (!item.empty() && item.back() == '/') item.pop_back();  // "http://a:1/" is the origin "http://a:1"
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

AccessPolicy::AccessPolicy(AccessOptions o) : o_(std::move(o)) {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) == 0) machine_name_ = lower(buf);
}

bool AccessPolicy::host_allowed(const std::string& host_header) const {
  if (host_header.empty()) return true;  // HTTP/1.0 clients; browsers always send Host
  const std::string name = host_name(host_header);
  if (is_ip_literal(name) || name == "localhost" || name.ends_with(".localhost")) return true;
  if (!machine_name_.empty() && (name == machine_name_ || name == machine_name_ + ".local")) return true;
  if (name == lower(o_.bind_host)) return true;
  for (const std::string& h : o_.allowed_hosts)
    if (h == "*" || lower(h) == name) return true;
  return false;
}

bool AccessPolicy::origin_allowed(const std::string& origin, const std::string& host_header) const {
  const std::string o = lower(origin);
  if (!host_header.empty() && (o == "http://" + lower(host_header) || o == "https://" + lower(host_header)))
    return true;  // the served page itself
  for (const std::string& c : o_.cors_origins)
    if (c == "*" || lower(c) == o) return true;
  return false;
}

bool AccessPolicy::key_matches(const std::string& authorization, const std::string& key) {
  // RFC 9110: the scheme is case-insensitive; one or more spaces before the credentials.
  if (key.empty() || authorization.size() < 7 || lower(authorization.substr(0, 6)) != "bearer" ||
      (authorization[6] != ' ' && authorization[6] != '\t'))
    return false;
  std::string given = authorization.substr(7);
  given.erase(0, given.find_first_not_of(" \t"));
  given.erase(given.find_last_not_of(" \t") + 1);
  // Compare in time independent of where they differ.
  unsigned diff = given.size() != key.size();
  for (size_t i = 0; i < given.size(); ++i) diff |= (unsigned char)given[i] ^ (unsigned char)key[i % key.size()];
  return diff == 0;
}

bool AccessPolicy::is_public(const std::string& method, const std::string& path) {
  if (method != "GET" && method != "HEAD") return false;
  return path == "/" || path == "/health" || path == "/v1/health" || path == "/favicon.ico" || path.starts_with("/web/");
}

std::optional<AccessPolicy::Refusal> AccessPolicy::check(const httplib::Request& req, httplib::Response& res) const {
  const std::string host = req.get_header_value("Host");
  if (!host_allowed(host))
    return Refusal{403,
                   fmt::format("Host '{}' is not allowed (a page on another site may be driving this browser); "
                               "start the server with --allowed-hosts {} to serve that name",
                               host.substr(0, 100), host_name(host).substr(0, 100)),
                   "host_not_allowed"};
  if (req.has_header("Origin")) {
    const std::string origin = req.get_header_value("Origin");
    if (!origin_allowed(origin, host))
      return Refusal{403,
                     fmt::format("cross-origin requests from '{}' are not allowed; start the server with "
                                 "--cors-origins {} to allow that site",
                                 origin.substr(0, 100), origin.substr(0, 100)),
                     "origin_not_allowed"};
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Vary", "Origin");
    if (req.method == "OPTIONS") {
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? "Authorization, Content-Type, x-api-key" : asked);
      res.set_header("Access-Control-Max-Age", "600");
      return Refusal{};
    }
  }
  if (!o_.api_key.empty() && !is_public(req.method, req.path)) {
    const std::string auth = req.get_header_value("Authorization"), x_key = req.get_header_value("x-api-key");
    if (auth.empty() && x_key.empty())
      return Refusal{401, "Missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key')",
                     "invalid_api_key"};
    if (!key_matches(auth, o_.api_key) && !key_matches("Bearer " + x_key, o_.api_key))
      return Refusal{401, "Incorrect API key provided", "invalid_api_key"};
  }
  return std::nullopt;
}

}  // namespace xpert::server
