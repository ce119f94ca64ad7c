#include <cstdio>
int main() { std::puts("xpert"); return 0; }
