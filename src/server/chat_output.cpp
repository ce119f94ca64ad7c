#include "server/chat_output.h"

#include <algorithm>

namespace xpert::server {

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>", kJsonFence = "```json";
constexpr std::string_view kFunctionOpen = "<function=", kParamOpen = "<parameter=", kParamClose = "</parameter>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// s is a non-empty proper beginning of p.
bool begins(std::string_view p, std::string_view s) { return !s.empty() && s.size() < p.size() && starts_with(p, s); }

std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The longest end of s that is a proper beginning of `marker` (text to hold back).
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

// After optional spaces, `lit` at s[i]: 1 (i moves past it), 0 (the text ends before it is known), -1 (not).
int expect(std::string_view s, size_t& i, std::string_view lit) {
  const size_t j = skip_space(s, i);
  const std::string_view rest = s.substr(j);
  if (starts_with(rest, lit)) {
    i = j + lit.size();
    return 1;
  }
  return starts_with(lit, rest) ? 0 : -1;
}

}  // namespace

ChatOutputParser::ChatOutputParser(ChatOutputOptions options) : o_(std::move(options)) {
  if (o_.split_reasoning && o_.in_reasoning) mode_ = Mode::reasoning;
}

ChatDelta ChatOutputParser::feed(std::string_view text) {
  pending_.append(text);
  run(false);
  return std::exchange(delta_, {});
}

ChatDelta ChatOutputParser::finish() {
  run(true);
  return std::exchange(delta_, {});
}

void ChatOutputParser::run(bool final) {
  while (true) {
    bool again = false;
    switch (mode_) {
      case Mode::start:
        again = step_start(final);
        break;
      case Mode::content:
        again = step_content(final);
        break;
      case Mode::reasoning:
        again = step_reasoning(final);
        break;
      case Mode::tagged_call:
        again = step_tagged_call(final);
        break;
      case Mode::json_whole:
        if (final) {
          auto calls = parse_json_calls(pending_, o_.tools);
          if (calls) {
            for (const ToolCall& c : *calls) {
              if (begin_call(c.name)) emit_arguments(c.arguments);
              call_open_ = call_dropped_ = false;
            }
          } else {
            emit_content(pending_);
          }
          pending_.clear();
        }
        break;
    }
    if (!again) return;
  }
}

// The beginning of the answer (or of what follows a reasoning span or a call): a <think> span, a JSON
// call, or content.
bool ChatOutputParser::step_start(bool final) {
  std::string_view lt = ltrim(pending_);
  if (lt.empty() && !final) return false;
  if (o_.split_reasoning && !reasoning_started_) {
    if (starts_with(lt, kThinkOpen)) {
      pending_.erase(0, pending_.size() - lt.size() + kThinkOpen.size());
      mode_ = Mode::reasoning;
      return true;
    }
    if (!final && begins(kThinkOpen, lt)) return false;
  }
  if (o_.parse_tools && !lt.empty()) {
    if (lt[0] == '{' || lt[0] == '[' || starts_with(lt, kJsonFence) || starts_with(lt, kPythonTag)) {
      mode_ = Mode::json_whole;
      return true;
    }
    if (!final && (begins(kJsonFence, lt) || begins(kPythonTag, lt))) return false;
  }
  // What follows a reasoning span or a call starts without the blank lines between them.
  if (!content_.empty() || !reasoning_.empty() || !calls_.empty()) pending_.erase(0, pending_.size() - lt.size());
  mode_ = Mode::content;
  return true;
}

bool ChatOutputParser::step_content(bool final) {
  if (!o_.parse_tools) {
    emit_content(pending_);
    pending_.clear();
    return false;
  }
  const size_t call = pending_.find(kCallOpen), tag = pending_.find(kPythonTag);
  const size_t at = std::min(call, tag);
  if (at != std::string::npos) {
    emit_content(rtrim(std::string_view(pending_).substr(0, at)));
    const bool tagged = at == call;
    pending_.erase(0, at + (tagged ? kCallOpen.size() : 0));
    mode_ = tagged ? Mode::tagged_call : Mode::json_whole;
    return true;
  }
  if (final) {
    emit_content(pending_);
    pending_.clear();
    return false;
  }
  size_t keep = std::max(partial_suffix(pending_, kCallOpen), partial_suffix(pending_, kPythonTag));
  size_t release = pending_.size() - keep;
  while (release > 0 && is_space(pending_[release - 1])) --release;  // blank lines before a call are not sent
  emit_content(std::string_view(pending_).substr(0, release));
  pending_.erase(0, release);
  return false;
}

bool ChatOutputParser::step_reasoning(bool final) {
  const size_t close = pending_.find(kThinkClose);
  if (close != std::string::npos) {
    emit_reasoning(rtrim(std::string_view(pending_).substr(0, close)));
    pending_.erase(0, close + kThinkClose.size());
    reasoning_started_ = true;  // one span: a later <think> is content
    mode_ = Mode::start;
    return true;
  }
  if (final) {
    emit_reasoning(rtrim(pending_));
    pending_.clear();
    return false;
  }
  size_t release = pending_.size() - partial_suffix(pending_, kThinkClose);
  while (release > 0 && is_space(pending_[release - 1])) --release;
  emit_reasoning(std::string_view(pending_).substr(0, release));
  pending_.erase(0, release);
  return false;
}

bool ChatOutputParser::step_tagged_call(bool final) {
  const size_t close = pending_.find(kCallClose);
  if (close == std::string::npos && !final) {
    stream_tagged_call(pending_);
    return false;
  }
  const bool closed = close != std::string::npos;
  const std::string inner = pending_.substr(0, closed ? close : pending_.size());
  // A call that arrives whole reads as if it had streamed: the same arguments text either way.
  if (!call_open_) stream_tagged_call(inner);
  if (call_open_) {
    stream_tagged_call(inner);  // what remains of the streamed form
    close_tagged_call(inner);
  } else if (auto c = parse_tagged_call(inner, o_.tools)) {
    if (begin_call(c->name)) emit_arguments(c->arguments);
  } else {
    emit_content(std::string(kCallOpen) + inner + (closed ? std::string(kCallClose) : ""));
  }
  call_open_ = call_dropped_ = args_done_ = incremental_failed_ = false;
  xml_first_param_ = true;
  args_start_ = args_sent_ = 0;
  pending_.erase(0, closed ? close + kCallClose.size() : pending_.size());
  mode_ = Mode::start;
  return closed;
}

// A call's text so far: announce the name as soon as it is known, send finished argument pieces.
void ChatOutputParser::stream_tagged_call(std::string_view s) {
  if (incremental_failed_) return;
  const size_t p = skip_space(s, 0);
  if (p == s.size()) return;
  if (s[p] == '<') {  // <function=NAME> <parameter=P>\nvalue\n</parameter> ... </function>
    if (!call_open_) {
      const std::string_view rest = s.substr(p);
      if (!starts_with(rest, kFunctionOpen)) {
        incremental_failed_ = !starts_with(kFunctionOpen, rest);
        return;
      }
      const size_t gt = s.find('>', p);
      if (gt == std::string_view::npos) return;
      const std::string name(ltrim(rtrim(s.substr(p + kFunctionOpen.size(), gt - p - kFunctionOpen.size()))));
      if (name.empty()) {
        incremental_failed_ = true;
        return;
      }
      begin_call(name);
      args_sent_ = gt + 1;
    }
    while (true) {
      const size_t q = s.find(kParamOpen, args_sent_);
      if (q == std::string_view::npos) return;
      const size_t gt = s.find('>', q);
      if (gt == std::string_view::npos) return;
      const size_t end = s.find(kParamClose, gt);
      if (end == std::string_view::npos) return;
      const std::string pname(ltrim(rtrim(s.substr(q + kParamOpen.size(), gt - q - kParamOpen.size()))));
      const std::string type = calls_.empty() ? "" : parameter_type(o_.tools, calls_.back().call.name, pname);
      emit_arguments((xml_first_param_ ? "{" : ", ") + nlohmann::ordered_json(pname).dump() + ": " +
                     xml_parameter_json(std::string(s.substr(gt + 1, end - gt - 1)), type));
      xml_first_param_ = false;
      args_sent_ = end + kParamClose.size();
    }
  }
  if (s[p] != '{') {
    incremental_failed_ = true;
    return;
  }
  if (!call_open_) {  // {"name": "NAME", "arguments": VALUE}: anything else comes whole at the end
    size_t i = p + 1;
    int r = expect(s, i, "\"name\"");
    if (r == 1) r = expect(s, i, ":");
    if (r == 1) {
      i = skip_space(s, i);
      const size_t name_start = i;
      bool bad = false;
      const auto end = json_value_end(s, i, &bad);
      if (bad || (end && s[i] != '"')) {
        r = -1;
      } else if (!end) {
        r = 0;
      } else {
        const size_t name_end = *end;
        r = expect(s, i = name_end, ",");
        if (r == 1) r = expect(s, i, "\"arguments\"");
        if (r == 1) r = expect(s, i, ":");
        if (r == 1) {
          i = skip_space(s, i);
          if (i == s.size()) return;
          if (s[i] != '{') r = -1;  // arguments as a string: decoded at the end
        }
        if (r == 1) {
          const auto name =
              nlohmann::ordered_json::parse(s.substr(name_start, name_end - name_start), nullptr, false);
          if (!name.is_string() || name.get<std::string>().empty()) r = -1;
          if (r == 1) {
            begin_call(name.get<std::string>());
            args_start_ = args_sent_ = i;
          }
        }
      }
    }
    if (r == -1) incremental_failed_ = true;
    if (r != 1) return;
  }
  if (args_done_) return;
  const auto end = json_value_end(s, args_start_);
  const size_t upto = end ? *end : s.size();
  emit_arguments(s.substr(args_sent_, upto - args_sent_));
  args_sent_ = upto;
  args_done_ = end.has_value();
}

// The end of a call whose name was sent: the XML form closes its object; a JSON call that did not
// stream sends its arguments whole.
void ChatOutputParser::close_tagged_call(std::string_view inner) {
  if (call_dropped_) return;
  const std::string_view s = ltrim(inner);
  if (starts_with(s, kFunctionOpen)) {
    emit_arguments(xml_first_param_ ? "{}" : "}");
  } else if (args_sent_ == args_start_) {
    auto c = parse_tagged_call(inner, o_.tools);
    emit_arguments(c ? c->arguments : "{}");
  }
}

void ChatOutputParser::emit_content(std::string_view s) {
  if (s.empty()) return;
  content_.append(s);
  delta_.content.append(s);
}

void ChatOutputParser::emit_reasoning(std::string_view s) {
  if (!reasoning_started_ && reasoning_.empty()) s = ltrim(s);
  if (s.empty()) return;
  reasoning_.append(s);
  delta_.reasoning.append(s);
}

bool ChatOutputParser::begin_call(const std::string& name) {
  call_open_ = true;
  if (!o_.parallel_calls && !calls_.empty()) {
    call_dropped_ = true;
    return false;
  }
  const size_t index = calls_.size();
  calls_.push_back({o_.call_id_prefix + std::to_string(index), {name, ""}});
  delta_.calls.push_back({index, calls_.back().id, name, ""});
  return true;
}

void ChatOutputParser::emit_arguments(std::string_view s) {
  if (call_dropped_ || s.empty() || calls_.empty()) return;
  calls_.back().call.arguments.append(s);
  const size_t index = calls_.size() - 1;
  if (delta_.calls.empty() || delta_.calls.back().index != index) delta_.calls.push_back({index, "", "", ""});
  delta_.calls.back().arguments.append(s);
}

ChatDelta ChatOutputParser::whole() const {
  ChatDelta d{content_, reasoning_, {}};
  for (size_t i = 0; i < calls_.size(); ++i) d.calls.push_back({i, calls_[i].id, calls_[i].call.name, calls_[i].call.arguments});
  return d;
}

nlohmann::ordered_json message_fields(const ChatDelta& d, bool delta) {
  using ojson = nlohmann::ordered_json;
  ojson m = ojson::object();
  if (!d.content.empty() || !delta) m["content"] = d.content.empty() && !d.calls.empty() ? ojson() : ojson(d.content);
  if (!d.reasoning.empty()) m["reasoning_content"] = d.reasoning;
  if (d.calls.empty()) return m;
  ojson calls = ojson::array();
  for (const CallDelta& c : d.calls) {
    ojson call = ojson::object();
    if (delta) call["index"] = c.index;
    if (!c.id.empty()) {
      call["id"] = c.id;
      call["type"] = "function";
      call["function"] = {{"name", c.name}, {"arguments", c.arguments}};
    } else {
      call["function"] = {{"arguments", c.arguments}};
    }
    calls.push_back(std::move(call));
  }
  m["tool_calls"] = std::move(calls);
  return m;
}

}  // namespace xpert::server
