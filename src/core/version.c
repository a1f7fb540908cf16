/* The run-time version (flextier/core.h): what the library was built as,
 * which a program compiled against other headers can compare. */
#include "flextier/core.h"

unsigned ft_version_number(void) { return FT_VERSION_NUMBER; }

const char *ft_version_string(void) { return FT_VERSION_STRING; }
