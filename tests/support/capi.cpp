// placeholder, replaced by the numerics tests
extern "C" int octet_capi_version() { return 1; }
