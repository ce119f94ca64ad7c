// The chat page's build-time embedding and the /web/ files it loads from Debian's packages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/web_ui.h"

namespace fs = std::filesystem;
using namespace xpert::server;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

}  // namespace

TEST(WebUi, PageIsTheSourceFileByteForByte) {
  const std::string file = read_all(fs::path(XPERT_SOURCE_DIR) / "src/server/web_ui.html");
  ASSERT_GT(file.size(), 1000u);
  EXPECT_EQ(web_chat_html(), file);
}

TEST(WebUi, AssetsAreReadFromTheirDebianPathsAtEachRequest) {
  const fs::path root = fs::temp_directory_path() / ("xpert_web_ui_" + std::to_string(::getpid()));
  fs::remove_all(root);
  // Nothing installed: every file is absent.
  EXPECT_FALSE(read_web_asset("/web/marked.min.js", root.string()));
  EXPECT_FALSE(read_web_asset("/web/purify.min.js", root.string()));

  write(root / "usr/share/javascript/marked/marked.min.js", "var marked = 1;\n");
  write(root / "usr/share/javascript/highlight.js/styles/github.css", ".hljs {}\n");
  auto js = read_web_asset("/web/marked.min.js", root.string());
  ASSERT_TRUE(js);
  EXPECT_EQ(js->body, "var marked = 1;\n");
  EXPECT_STREQ(js->content_type, "text/javascript; charset=utf-8");
  auto css = read_web_asset("/web/highlight.css", root.string());
  ASSERT_TRUE(css);
  EXPECT_STREQ(css->content_type, "text/css; charset=utf-8");
  EXPECT_FALSE(read_web_asset("/web/purify.min.js", root.string()));  // still not installed

  write(root / "usr/share/javascript/marked/marked.min.js", "var marked = 2;\n");  // upgraded meanwhile
  EXPECT_EQ(read_web_asset("/web/marked.min.js", root.string())->body, "var marked = 2;\n");
  fs::remove(root / "usr/share/javascript/marked/marked.min.js");  // removed meanwhile
  EXPECT_FALSE(read_web_asset("/web/marked.min.js", root.string()));

  // Only the table's URLs name files.
  write(root / "etc/passwd", "secret");
  EXPECT_FALSE(read_web_asset("/web/../../etc/passwd", root.string()));
  EXPECT_FALSE(read_web_asset("/etc/passwd", root.string()));
  EXPECT_FALSE(read_web_asset("/web/", root.string()));
  fs::remove_all(root);
}
