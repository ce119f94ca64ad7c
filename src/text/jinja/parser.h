// Tokens -> Program. Recursive descent over Jinja's grammar with Jinja's operator precedence
// (filters bind tighter than arithmetic; `not` looser than comparisons). Statements outside the
// chat-template subset (include, extends, block, import, ...) fail with the construct and line named.
#pragma once
#include <string_view>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace xpert::jinja {

// Throws xpert::Error ("line N: ...") on a syntax error or an unsupported construct.
Program parse(std::string_view source, const LexOptions& options = {});

}  // namespace xpert::jinja
