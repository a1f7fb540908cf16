#include "ft_test.h"
TEST(placeholder){CHECK(1);}
