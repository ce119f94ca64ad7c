// Real model chat templates (tests/reference/templates/) against Python jinja2 set up as transformers'
// apply_chat_template: tests/reference/fixtures/chat_templates.json, made by
// tests/reference/make_template_fixtures.py. Every template x conversation must give the same bytes,
// or an Error where jinja2 raised.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "text/chat_template.h"

namespace xpert {
namespace {

using ojson = nlohmann::ordered_json;

std::string source_dir() {
  const char* env = std::getenv("XPERT_SOURCE_DIR");
  return env && *env ? env : XPERT_SOURCE_DIR;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first differing position, with context, for a readable failure.
std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "at byte " + std::to_string(i) + "\n  want: ..." + ojson(want.substr(from, 100)).dump() +
         "\n  got:  ..." + ojson(got.substr(from, 100)).dump();
}

TEST(ChatTemplateReference, MatchesJinja2ForEveryTemplateAndConversation) {
  const std::string dir = source_dir() + "/tests/reference";
  const ojson ref = ojson::parse(read_file(dir + "/fixtures/chat_templates.json"));
  ASSERT_GE(ref["templates"].size(), 7u);
  ASSERT_GE(ref["conversations"].size(), 12u);
  int identical = 0, errors_matched = 0, total = 0;
  for (const ojson& t : ref["templates"]) {
    const std::string name = t["name"];
    const ChatTemplate tmpl(read_file(dir + "/templates/" + t["file"].get<std::string>()), t["bos_token"],
                            t["eos_token"]);
    EXPECT_EQ(tmpl.capabilities().content_parts, t["capabilities"]["content_parts"].get<bool>()) << name;
    EXPECT_EQ(tmpl.capabilities().object_arguments, t["capabilities"]["object_arguments"].get<bool>())
        << name;
    for (const ojson& conv : ref["conversations"]) {
      const std::string conv_name = conv["name"];
      const ojson& want = t["results"][conv_name];
      ChatRenderOptions opt;
      opt.add_generation_prompt = conv["add_generation_prompt"];
      opt.tools = conv["tools"];
      opt.extra = conv["extra"];
      opt.now_unix = ref["now_unix"].get<int64_t>();
      ++total;
      if (want["ok"].get<bool>()) {
        try {
          const std::string got = tmpl.render(conv["messages"], opt);
          const std::string expected = want["text"];
          EXPECT_EQ(got, expected) << name << " x " << conv_name << ": " << first_difference(expected, got);
          if (got == expected) ++identical;
        } catch (const Error& e) {
          ADD_FAILURE() << name << " x " << conv_name << ": unexpected error: " << e.what();
        }
      } else {
        try {
          tmpl.render(conv["messages"], opt);
          ADD_FAILURE() << name << " x " << conv_name << ": rendered, but jinja2 raised " << want["error"];
        } catch (const Error&) {
          ++errors_matched;
        }
      }
    }
  }
  std::printf("chat templates: %d identical, %d errors matched, of %d template x conversation pairs\n",
              identical, errors_matched, total);
}

}  // namespace
}  // namespace xpert
