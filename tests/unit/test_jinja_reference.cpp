// One small template per interpreter feature against Python jinja2 (transformers' environment):
// tests/reference/fixtures/chat_templates_features.json, from tests/reference/make_template_fixtures.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "text/jinja/template.h"

namespace xpert::jinja {
namespace {

using ojson = nlohmann::ordered_json;

std::string source_dir() {
  const char* env = std::getenv("XPERT_SOURCE_DIR");
  return env && *env ? env : XPERT_SOURCE_DIR;
}

TEST(JinjaReference, EveryFeatureCaseMatchesJinja2) {
  std::ifstream in(source_dir() + "/tests/reference/fixtures/chat_templates_features.json", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const ojson ref = ojson::parse(ss.str());
  ASSERT_GE(ref["cases"].size(), 100u);
  RenderSettings settings;
  settings.now_unix = ref["now_unix"].get<int64_t>();
  int matched = 0;
  for (const ojson& c : ref["cases"]) {
    const std::string name = c["name"];
    const std::string source = c["template"];
    if (c["ok"].get<bool>()) {
      try {
        const std::string got = Template(source).render(Value::from_json(c["vars"]), settings);
        EXPECT_EQ(got, c["text"].get<std::string>()) << name << ": " << source;
        matched += got == c["text"].get<std::string>();
      } catch (const Error& e) {
        ADD_FAILURE() << name << ": unexpected error: " << e.what() << "\n  template: " << source;
      }
    } else {
      try {
        const std::string got = Template(source).render(Value::from_json(c["vars"]), settings);
        ADD_FAILURE() << name << ": rendered " << ojson(got).dump() << " but jinja2 raised " << c["error"];
      } catch (const Error&) {
        ++matched;
      }
    }
  }
  std::printf("jinja features: %d of %zu cases match jinja2\n", matched, ref["cases"].size());
}

}  // namespace
}  // namespace xpert::jinja
