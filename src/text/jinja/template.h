// A Jinja2 interpreter for the subset that model chat templates use, configured like Hugging Face's
// apply_chat_template (trim_blocks, lstrip_blocks, loop controls, `{% generation %}`, a `tojson` that is
// json.dumps(ensure_ascii=False) without HTML escaping, `raise_exception`, `strftime_now`).
//
//   jinja::Template t(source);            // parses; throws xpert::Error ("line N: ...") on bad syntax
//   std::string s = t.render(variables);  // a dict Value; throws xpert::Error on a runtime error
//
// Undefined variables print as "" (jinja2's default Undefined); attribute access on an undefined value
// is an error, as in jinja2. Constructs outside the subset fail with the construct and line named.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"
#include "text/jinja/value.h"

namespace xpert::jinja {

struct RenderSettings {
  std::optional<int64_t> now_unix;  // the clock of strftime_now (local time); unset: the current time
  size_t max_output_bytes = size_t{64} << 20;
  int max_call_depth = 64;  // macro recursion
};

class Template {
 public:
  explicit Template(std::string_view source, const LexOptions& options = {});
  // `variables` must be a dict; its entries become the template's top-level variables.
  std::string render(const Value& variables, const RenderSettings& settings = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace xpert::jinja
