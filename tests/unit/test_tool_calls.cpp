// ChatOutputParser and the tool-call formats (server/chat_output.h, server/tool_calls.h) on the text
// models write: whole, and fed in pieces of every size (what the client sees must not depend on them).
#include <gtest/gtest.h>

#include "sample/grammar.h"
#include "server/chat_output.h"
#include "server/chat_plan.h"
#include "server/tool_calls.h"

namespace xpert::server {
namespace {

using ojson = nlohmann::ordered_json;

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
   "properties": {"zone": {"type": "string"}}}}}])");

struct Result {
  std::string content, reasoning;
  std::vector<ParsedCall> calls;  // merged from the deltas
  size_t argument_pieces = 0;     // deltas that carried arguments
};

ChatOutputOptions tool_options() {
  ChatOutputOptions o;
  o.parse_tools = true;
  o.tools = kTools;
  return o;
}

// Feeds `text` in pieces of `piece` bytes (0: whole) and merges the deltas as a client does.
Result parse(const std::string& text, size_t piece, ChatOutputOptions o = tool_options()) {
  ChatOutputParser p(o);
  Result r;
  auto take = [&](const ChatDelta& d) {
    r.content += d.content;
    r.reasoning += d.reasoning;
    for (const CallDelta& c : d.calls) {
      if (c.index == r.calls.size()) {
        EXPECT_FALSE(c.id.empty());
        EXPECT_FALSE(c.name.empty());
        r.calls.push_back({c.id, {c.name, ""}});
      }
      ASSERT_LT(c.index, r.calls.size());
      r.calls[c.index].call.arguments += c.arguments;
      if (!c.arguments.empty()) r.argument_pieces++;
    }
  };
  if (piece == 0) {
    take(p.feed(text));
  } else {
    for (size_t i = 0; i < text.size(); i += piece) take(p.feed(text.substr(i, piece)));
  }
  take(p.finish());
  // The totals equal the merged deltas.
  EXPECT_EQ(p.content(), r.content);
  EXPECT_EQ(p.reasoning(), r.reasoning);
  EXPECT_EQ(p.calls().size(), r.calls.size());
  for (size_t i = 0; i < r.calls.size() && i < p.calls().size(); ++i)
    EXPECT_EQ(p.calls()[i].call.arguments, r.calls[i].call.arguments);
  return r;
}

// Every piece size gives the same result as the whole text.
Result parse_all_ways(const std::string& text, ChatOutputOptions o = tool_options()) {
  const Result whole = parse(text, 0, o);
  for (size_t piece : {1, 2, 3, 5, 7, 16}) {
    const Result r = parse(text, piece, o);
    EXPECT_EQ(r.content, whole.content) << "piece " << piece;
    EXPECT_EQ(r.reasoning, whole.reasoning) << "piece " << piece;
    EXPECT_EQ(r.calls.size(), whole.calls.size()) << "piece " << piece;
    for (size_t i = 0; i < r.calls.size() && i < whole.calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].call.name, whole.calls[i].call.name);
      EXPECT_EQ(r.calls[i].call.arguments, whole.calls[i].call.arguments) << "piece " << piece;
      EXPECT_TRUE(ojson::parse(r.calls[i].call.arguments, nullptr, false).is_object());
    }
  }
  return whole;
}

// Qwen2.5's documented form (its template's instructions).
const std::string kQwen25Call =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

// Qwen2.5-Coder-1.5B-Instruct Q4_K_M's greedy answers (xpert serve, temperature 0, its own template):
// to "What's the weather in Paris?" with a get_weather tool, a fenced JSON call instead of <tool_call>;
// after the tool's result, with tools still offered, the template's doubled brace copied (not a call).
const std::string kQwen25CoderCall =
    "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```";
const std::string kQwen25CoderBraces = "{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}";

TEST(ToolCalls, Qwen25CoderRealOutput) {
  const Result r = parse_all_ways(kQwen25CoderCall);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].call.name, "get_weather");
  EXPECT_EQ(ojson::parse(r.calls[0].call.arguments), ojson::parse(R"({"city": "Paris"})"));
  const Result b = parse_all_ways(kQwen25CoderBraces);
  EXPECT_EQ(b.content, kQwen25CoderBraces);
  EXPECT_TRUE(b.calls.empty());
}

TEST(ToolCalls, HermesJsonCall) {
  const Result r = parse_all_ways(kQwen25Call);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].call.name, "get_weather");
  EXPECT_EQ(ojson::parse(r.calls[0].call.arguments), ojson::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(r.calls[0].id, "call_0");
}

TEST(ToolCalls, HermesArgumentsStreamInPieces) {
  const Result r = parse(kQwen25Call, 1);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_GT(r.argument_pieces, 5u);  // not one piece at the end
  EXPECT_EQ(r.calls[0].call.arguments, R"({"city": "Paris"})");
}

TEST(ToolCalls, ContentBeforeCallAndParallelCalls) {
  const std::string text =
      "Let me check both.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": "
      "\"Europe/Paris\"}}\n</tool_call>";
  const Result r = parse_all_ways(text);
  EXPECT_EQ(r.content, "Let me check both.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].call.name, "get_weather");
  EXPECT_EQ(ojson::parse(r.calls[0].call.arguments)["days"], 3);
  EXPECT_EQ(r.calls[1].call.name, "get_time");
  EXPECT_EQ(r.calls[1].id, "call_1");

  ChatOutputOptions one = tool_options();
  one.parallel_calls = false;
  const Result first = parse_all_ways(text, one);
  ASSERT_EQ(first.calls.size(), 1u);
  EXPECT_EQ(first.calls[0].call.name, "get_weather");
}

TEST(ToolCalls, HermesArgumentsBeforeNameComeWhole) {
  const Result r = parse_all_ways(
      "<tool_call>\n{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].call.name, "get_weather");
  EXPECT_EQ(ojson::parse(r.calls[0].call.arguments), ojson::parse(R"({"city": "Oslo"})"));
  const Result s = parse_all_ways(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}\n</tool_call>");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(ojson::parse(s.calls[0].call.arguments), ojson::parse(R"({"city": "Rome"})"));
}

// Qwen3.5's and Qwen3-Coder's form, as its template instructs (typed by the schema).
TEST(ToolCalls, QwenXmlCall) {
  const std::string text =
      "I will look it up.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  const Result r = parse_all_ways(text);
  EXPECT_EQ(r.content, "I will look it up.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].call.name, "get_weather");
  EXPECT_EQ(ojson::parse(r.calls[0].call.arguments), ojson::parse(R"({"city": "New York", "days": 3})"));
  EXPECT_GE(parse(text, 1).argument_pieces, 2u);  // a parameter at a time
  // A string parameter that looks like a number stays a string.
  const Result s = parse_all_ways(
      "<tool_call>\n<function=get_time>\n<parameter=zone>\n123\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(ojson::parse(s.calls[0].call.arguments), ojson::parse(R"({"zone": "123"})"));
  const Result none = parse_all_ways("<tool_call>\n<function=get_time>\n</function>\n</tool_call>");
  ASSERT_EQ(none.calls.size(), 1u);
  EXPECT_EQ(none.calls[0].call.arguments, "{}");
}

// Llama 3.1/3.2: JSON with "parameters", with or without <|python_tag|>, several separated by ';'.
TEST(ToolCalls, Llama3Json) {
  for (const std::string prefix : {"", "<|python_tag|>"}) {
    const Result r = parse_all_ways(prefix + R"({"name": "get_weather", "parameters": {"city": "Paris"}})");
    EXPECT_EQ(r.content, "");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].call.name, "get_weather");
    EXPECT_EQ(ojson::parse(r.calls[0].call.arguments), ojson::parse(R"({"city": "Paris"})"));
  }
  const Result two = parse_all_ways(
      R"({"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}})");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[1].call.name, "get_time");
  EXPECT_EQ(two.calls[1].call.arguments, "{}");
}

TEST(ToolCalls, GenericJson) {
  const Result fenced = parse_all_ways(
      "```json\n{\"tool_calls\": [{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]}\n```");
  ASSERT_EQ(fenced.calls.size(), 1u);
  EXPECT_EQ(fenced.calls[0].call.name, "get_time");
  const Result openai = parse_all_ways(
      R"([{"type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": \"UTC\"}"}}])");
  ASSERT_EQ(openai.calls.size(), 1u);
  EXPECT_EQ(ojson::parse(openai.calls[0].call.arguments), ojson::parse(R"({"zone": "UTC"})"));
}

TEST(ToolCalls, JsonThatIsNotACallIsContent) {
  for (const std::string text : {R"({"city": "Paris", "temperature": 21})", R"({"name": "unknown_fn", "arguments": {}})",
                                 "[1, 2, 3]", "```json\n{\"a\": 1}\n```", "{ not json"}) {
    const Result r = parse_all_ways(text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
  }
}

TEST(ToolCalls, TextThatLooksLikeAMarkerIsContent) {
  for (const std::string text : {"a < b and <tool", "x <tool_c", "Use `<think>` tags", "Done.\n\n"}) {
    const Result r = parse_all_ways(text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
  }
  // Without tools, nothing is a call.
  ChatOutputOptions plain;
  EXPECT_EQ(parse_all_ways(kQwen25Call, plain).content, kQwen25Call);
}

TEST(ToolCalls, BrokenCallIsContent) {
  const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"argu";  // cut by max_tokens
  const Result r = parse_all_ways(text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.calls.empty());
  const Result t = parse_all_ways("<tool_call>\nnot a call\n</tool_call> after");
  EXPECT_EQ(t.content, "<tool_call>\nnot a call\n</tool_call>after");
}

TEST(Reasoning, ThinkSpanSplits) {
  ChatOutputOptions o;
  const Result r = parse_all_ways("<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!", o);
  EXPECT_EQ(r.reasoning, "The user greets me.\nI greet back.");
  EXPECT_EQ(r.content, "Hello!");
  // The template opened the span (Qwen3.5, DeepSeek-R1): only </think> comes.
  o.in_reasoning = true;
  const Result open = parse_all_ways("Thinking.\n</think>\n\nAnswer.", o);
  EXPECT_EQ(open.reasoning, "Thinking.");
  EXPECT_EQ(open.content, "Answer.");
  // Cut inside the span: all of it is reasoning.
  EXPECT_EQ(parse_all_ways("Still thinking", o).reasoning, "Still thinking");
  // reasoning_format none: the text as generated.
  ChatOutputOptions keep;
  keep.split_reasoning = false;
  const std::string text = "<think>\nhmm\n</think>\n\nHi";
  EXPECT_EQ(parse_all_ways(text, keep).content, text);
  EXPECT_EQ(parse_all_ways(text, keep).reasoning, "");
}

TEST(Reasoning, ThenToolCall) {
  ChatOutputOptions o = tool_options();
  o.in_reasoning = true;
  const Result r = parse_all_ways(
      "I need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
      "</parameter>\n</function>\n</tool_call>",
      o);
  EXPECT_EQ(r.reasoning, "I need the weather.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(ojson::parse(r.calls[0].call.arguments), ojson::parse(R"({"city": "Paris"})"));
}

TEST(ToolCalls, FormatOfTemplate) {
  EXPECT_EQ(tool_format_for("<tool_call>\\n<function=x>\\n<parameter=y>"), ToolFormat::qwen_xml);
  EXPECT_EQ(tool_format_for("within <tool_call></tool_call> XML tags"), ToolFormat::hermes_json);
  EXPECT_EQ(tool_format_for("{{- '<|start_header_id|>ipython<|end_header_id|>' }}"), ToolFormat::llama3_json);
  EXPECT_EQ(tool_format_for("{{ bos_token }}"), ToolFormat::generic_json);
}

TEST(ToolCalls, JsonValueEnd) {
  EXPECT_EQ(json_value_end(R"({"a": "}"} tail)", 0), 10u);
  EXPECT_EQ(json_value_end(R"({"a": [1, {"b": 2}]})", 0), 20u);
  EXPECT_FALSE(json_value_end(R"({"a": [1, 2)", 0).has_value());
  bool bad = false;
  EXPECT_FALSE(json_value_end("{]", 0, &bad).has_value());
  EXPECT_TRUE(bad);
  EXPECT_EQ(json_value_end("12, 3", 0), 2u);
}

// tool_choice "required" / a named function: the prompt ends with the call's start, the grammar takes
// exactly the rest of a call to a known function, and the parser reads start + rest as that call.
TEST(ForcedCall, GrammarTakesTheCallAndNothingElse) {
  struct Case {
    ToolFormat format;
    std::string rest_required, rest_named;  // generated after forced_call_start(format, "" / "get_time")
  };
  const Case cases[] = {
      {ToolFormat::hermes_json, "get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
       "{\"zone\": \"UTC\"}}\n</tool_call>"},
      {ToolFormat::qwen_xml, "get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
       "<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>"},
      {ToolFormat::llama3_json, "get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "{\"zone\": \"UTC\"}}"},
      {ToolFormat::generic_json, "get_weather\", \"arguments\": {\"city\": \"Paris\"}}]}",
       "{\"zone\": \"UTC\"}}]}"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(tool_format_name(c.format));
    for (const bool named : {false, true}) {
      const std::string name = named ? "get_time" : "";
      const std::string rest = named ? c.rest_named : c.rest_required;
      auto g = Grammar::parse(forced_call_grammar(c.format, kTools, name, /*parallel=*/true));
      GrammarMatcher m(g);
      EXPECT_TRUE(m.accept(rest)) << rest;
      EXPECT_TRUE(m.complete());
      GrammarMatcher plain(g);
      EXPECT_FALSE(plain.accept("Hello! How can I help?"));
      GrammarMatcher unknown(g);
      if (!named) {
        EXPECT_FALSE(unknown.accept("get_date"));
      }
      const Result r = parse_all_ways(forced_call_start(c.format, name) + rest);
      ASSERT_EQ(r.calls.size(), 1u);
      EXPECT_EQ(r.calls[0].call.name, named ? "get_time" : "get_weather");
      EXPECT_EQ(r.content, "");
    }
  }
}

// The forced call's arguments follow its tool's `parameters` schema; the name picks the schema.
TEST(ForcedCall, ArgumentsFollowTheToolsSchema) {
  struct Case {
    ToolFormat format;
    std::vector<std::string> good, bad;  // after forced_call_start(format, "")
  };
  const Case cases[] = {
      {ToolFormat::hermes_json,
       {"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
        "get_time\", \"arguments\": {}}\n</tool_call>"},
       {"get_weather\", \"arguments\": {}}\n</tool_call>",                       // city is required
        "get_weather\", \"arguments\": {\"city\": 3}}\n</tool_call>",            // not a string
        "get_weather\", \"arguments\": {\"city\": \"a\", \"days\": 1.5}}\n</tool_call>",  // not an integer
        "get_time\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"}},     // get_weather's schema
      {ToolFormat::qwen_xml,
       {"get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "get_time>\n</function>\n</tool_call>"},
       {"get_weather>\n</function>\n</tool_call>",
        "get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\ntwo\n</parameter>\n</function>\n</tool_call>",
        "get_time>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"}},
      {ToolFormat::llama3_json, {"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"},
       {"get_weather\", \"parameters\": {\"town\": \"Paris\"}}"}},
      {ToolFormat::generic_json, {"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]}"},
       {"get_time\", \"arguments\": {\"zone\": [1]}}]}"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(tool_format_name(c.format));
    auto g = Grammar::parse(forced_call_grammar(c.format, kTools, "", /*parallel=*/false));
    for (const std::string& text : c.good) {
      GrammarMatcher m(g);
      EXPECT_TRUE(m.accept(text) && m.complete()) << text;
      const Result r = parse_all_ways(forced_call_start(c.format, "") + text);
      ASSERT_EQ(r.calls.size(), 1u) << text;
    }
    for (const std::string& text : c.bad) {
      GrammarMatcher m(g);
      EXPECT_FALSE(m.accept(text) && m.complete()) << text;
    }
  }
  // A schema the converter cannot express is a 400 naming the tool's parameters, not a looser call.
  ojson tools = kTools;
  tools[1]["function"]["parameters"]["properties"]["zone"]["not"] = {{"const", "x"}};
  try {
    forced_call_grammar(ToolFormat::hermes_json, tools, "", false);
    FAIL() << "expected a 400";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools[1].function.parameters");
  }
}

}  // namespace
}  // namespace xpert::server
