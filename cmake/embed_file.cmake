# Writes OUTPUT, a C++ file defining `std::string_view NAME()` in namespace NAMESPACE that returns the
# bytes of INPUT: files the binary serves (the chat page) stay files in the source tree.
#   cmake -DINPUT=page.html -DOUTPUT=page.cpp -DNAME=web_chat_html -DNAMESPACE=xpert::server -P embed_file.cmake
get_filename_component(input_name "${INPUT}" NAME)
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n_bytes "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp" "// Generated from ${input_name} by cmake/embed_file.cmake; do not edit.\n#include <string_view>\n\nnamespace ${NAMESPACE} {\nnamespace {\nconst unsigned char kBytes[] = {\n${bytes}0};\n}  // namespace\n\nstd::string_view ${NAME}() { return {reinterpret_cast<const char*>(kBytes), ${n_bytes}}; }\n\n}  // namespace ${NAMESPACE}\n")
# Only a changed file is rewritten, so an unchanged page recompiles nothing.
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
