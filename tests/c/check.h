/*
 * CHECK for the single-process C tests: a condition that does not hold is printed with its
 * line and fails the function it is in (return 1: from main, the program).
 */
#ifndef ANYCHIP_TESTS_CHECK_H
#define ANYCHIP_TESTS_CHECK_H

#include <stdio.h>

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAILED line %d: %s\n", __LINE__, #cond);                    \
            return 1;                                                           \
        }                                                                       \
    } while (0)

#endif
