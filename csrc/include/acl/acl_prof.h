/* CANN include name; the declarations are in acl/acl.h */
#include "acl.h"
