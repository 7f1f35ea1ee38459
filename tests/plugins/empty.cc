// A shared library that loads but registers no stage type.
extern "C" int ferry_test_empty_plugin() { return 0; }
