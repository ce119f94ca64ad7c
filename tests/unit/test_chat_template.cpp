// ChatTemplate: loading from GGUF, the ChatML fallback, message normalization and input checks.
// Byte-exactness against transformers is in test_chat_template_reference.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "format/gguf.h"
#include "text/builtin_templates.h"
#include "text/chat_template.h"

namespace xpert {
namespace {

using ojson = nlohmann::ordered_json;

std::string template_file(const std::string& name) {
  const char* env = std::getenv("XPERT_SOURCE_DIR");
  const std::string root = env && *env ? env : XPERT_SOURCE_DIR;
  std::ifstream in(root + "/tests/reference/templates/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct GGUFImage {
  std::vector<uint8_t> bytes;
  std::unique_ptr<gguf::GGUFFile> file;
};

GGUFImage make_gguf(const std::optional<std::string>& chat_template) {
  gguf::GGUFWriter w;
  w.set_strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "hello"});
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  if (chat_template) w.set_string("tokenizer.chat_template", *chat_template);
  GGUFImage img;
  img.bytes = w.to_bytes();
  img.file = gguf::GGUFFile::parse(img.bytes.data(), img.bytes.size(), "test.gguf");
  return img;
}

const ojson kHello = ojson::array({{{"role", "user"}, {"content", "Hello"}}});

TEST(ChatTemplate, FromGgufReadsTemplateAndSpecialTokens) {
  const GGUFImage img =
      make_gguf("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}");
  const ChatTemplate t = ChatTemplate::from_gguf(*img.file);
  EXPECT_EQ(t.render(kHello), "<s>Hello</s>");
}

TEST(ChatTemplate, MissingTemplateIsAClearErrorOrChatML) {
  const GGUFImage img = make_gguf(std::nullopt);
  EXPECT_NE(error_of([&] { ChatTemplate::from_gguf(*img.file); }).find("no chat template"),
            std::string::npos);
  const ChatTemplate t = ChatTemplate::from_gguf_or_chatml(*img.file);
  EXPECT_EQ(t.render(kHello), "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(t.render(kHello, no_prompt), "<|im_start|>user\nHello<|im_end|>\n");
}

TEST(ChatTemplate, BadTemplateFailsAtLoadWithTheLine) {
  const GGUFImage img = make_gguf("ok\n{% if x %}never closed");
  const std::string msg = error_of([&] { ChatTemplate::from_gguf(*img.file); });
  EXPECT_NE(msg.find("chat template: line 2"), std::string::npos) << msg;
}

TEST(ChatTemplate, RaiseExceptionBecomesAnError) {
  const ChatTemplate gemma(template_file("Gemma-3.jinja"), "<bos>", "<eos>");
  const ojson twice =
      ojson::array({{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}});
  const std::string msg = error_of([&] { gemma.render(twice); });
  EXPECT_NE(msg.find("Conversation roles must alternate"), std::string::npos) << msg;
}

TEST(ChatTemplate, ToolCallArgumentsFollowTheTemplate) {
  const ojson chat = ojson::array(
      {{{"role", "user"}, {"content", "Weather?"}},
       {{"role", "assistant"},
        {"content", ""},
        {"tool_calls",
         ojson::array({{{"type", "function"},
                        {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}})}}});
  // Qwen3 prints objects with tojson: the string is parsed, then re-printed in json.dumps style.
  const ChatTemplate qwen(template_file("Qwen3.jinja"), "", "<|im_end|>");
  EXPECT_TRUE(qwen.capabilities().object_arguments);
  EXPECT_NE(qwen.render(chat).find("\"arguments\": {\"city\": \"Paris\"}"), std::string::npos);
  // DeepSeek concatenates arguments as a string: objects are serialized for it.
  const ChatTemplate deepseek(template_file("DeepSeek-V3.1.jinja"), "<s>", "</s>");
  EXPECT_FALSE(deepseek.capabilities().object_arguments);
  ojson object_chat = chat;
  object_chat[1]["tool_calls"][0]["function"]["arguments"] = {{"city", "Paris"}};
  EXPECT_NE(deepseek.render(object_chat).find("get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}"),
            std::string::npos);
}

TEST(ChatTemplate, ContentPartsAreJoinedForStringOnlyTemplates) {
  const ojson parts = ojson::array({{{"role", "user"},
                                     {"content", ojson::array({{{"type", "text"}, {"text", "one"}},
                                                               {{"type", "text"}, {"text", "two"}}})}}});
  const ChatTemplate qwen(template_file("Qwen3.jinja"), "", "<|im_end|>");
  EXPECT_FALSE(qwen.capabilities().content_parts);
  EXPECT_EQ(qwen.render(parts), "<|im_start|>user\none\ntwo<|im_end|>\n<|im_start|>assistant\n");
  const ChatTemplate gemma(template_file("Gemma-3.jinja"), "<bos>", "<eos>");
  EXPECT_TRUE(gemma.capabilities().content_parts);
  EXPECT_EQ(gemma.render(parts), "<bos><start_of_turn>user\nonetwo<end_of_turn>\n<start_of_turn>model\n");
  ojson image = parts;
  image[0]["content"].push_back({{"type", "image_url"}, {"image_url", {{"url", "x"}}}});
  EXPECT_NE(error_of([&] { qwen.render(image); }).find("only text content"), std::string::npos);
}

TEST(ChatTemplate, ExtraVariablesAndClock) {
  const ChatTemplate qwen(template_file("Qwen3.jinja"), "", "<|im_end|>");
  ChatRenderOptions o;
  o.extra = {{"enable_thinking", false}};
  EXPECT_EQ(qwen.render(kHello, o),
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  const ChatTemplate dated("{{ strftime_now('%d %b %Y') }}", "", "");
  o.now_unix = 1768469400;  // 2026-01-15 09:30 UTC
  EXPECT_EQ(dated.render(kHello, o), "15 Jan 2026");
}

TEST(ChatTemplate, MalformedInputIsRejected) {
  const ChatTemplate t = ChatTemplate::chatml();
  EXPECT_NE(error_of([&] { t.render(ojson::object()); }).find("expected an array"), std::string::npos);
  EXPECT_NE(error_of([&] { t.render(ojson::array({"hi"})); }).find("messages[0]: expected an object"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              t.render(ojson::array({{{"content", "x"}}}));
            }).find("missing string 'role'"),
            std::string::npos);
  ChatRenderOptions o;
  o.tools = {{"type", "function"}};
  EXPECT_NE(error_of([&] { t.render(kHello, o); }).find("chat tools: expected an array"), std::string::npos);
}

}  // namespace
}  // namespace xpert

namespace xpert {
namespace {

// A template without tools, tool turns or a developer role (Gemma 3's) renders them through the
// fallbacks when asked, and its own way (dropping or raising) when not.
TEST(ChatTemplate, FallbacksForWhatTheTemplateLacks) {
  const ChatTemplate t(std::string(*builtin_chat_template("gemma3")), "<bos>", "<eos>");
  EXPECT_FALSE(t.capabilities().tools);
  EXPECT_FALSE(t.capabilities().tool_calls);
  EXPECT_FALSE(t.capabilities().tool_results);
  EXPECT_FALSE(t.capabilities().developer_role);
  const ojson tools = ojson::parse(
      R"([{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}])");
  const ojson msgs = ojson::parse(R"([
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "Time in Paris and Oslo?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "a", "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": \"Europe/Paris\"}"}},
      {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": \"Europe/Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "a", "content": "10:00"},
    {"role": "tool", "tool_call_id": "b", "content": "10:01"}])");
  ChatRenderOptions o;
  o.tools = tools;
  EXPECT_THROW(t.render(msgs, o), Error);  // the template alone: roles must alternate
  o.fallbacks = true;
  const std::string text = t.render(msgs, o);
  EXPECT_NE(text.find("Be brief."), std::string::npos);
  EXPECT_NE(text.find("get_time"), std::string::npos);
  EXPECT_NE(text.find(R"("zone":"Europe/Oslo")"), std::string::npos);
  // Both results in one user turn, after the model's turn.
  EXPECT_NE(text.find("10:00\n\nTool result:\n10:01<end_of_turn>"), std::string::npos) << text;
}

TEST(ChatTemplate, CapabilitiesOfATemplateWithTools) {
  const char* src =
      "{% for m in messages %}{{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}"
      "[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}\n{% endfor %}"
      "{% for t in tools or [] %}tool {{ t.function.name }}\n{% endfor %}";
  const ChatTemplate t(src, "", "");
  EXPECT_TRUE(t.capabilities().tools);
  EXPECT_TRUE(t.capabilities().tool_calls);
  EXPECT_TRUE(t.capabilities().tool_results);
  EXPECT_TRUE(t.capabilities().developer_role);
}

}  // namespace
}  // namespace xpert
