/*
 * Checks for the C test programs, in the style of the public ACL samples: every call's
 * return code is checked; a failure prints the call, the code and aclGetRecentErrMsg(), and
 * the program exits 1. Each program prints "run success!" at its end.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef RUNTIME_ACL_TEST_CHECK_H
#define RUNTIME_ACL_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"

#define INFO_LOG(fmt, ...) fprintf(stdout, "[INFO]  " fmt "\n", ##__VA_ARGS__)
#define ERROR_LOG(fmt, ...) fprintf(stderr, "[ERROR] %s:%d: " fmt "\n", __FILE__, __LINE__, ##__VA_ARGS__)

/* The call must succeed. */
#define CHECK_ACL(call)                                                                  \
    do {                                                                                 \
        aclError check_ret_ = (call);                                                    \
        if (check_ret_ != ACL_SUCCESS) {                                                 \
            const char *check_msg_ = aclGetRecentErrMsg();                               \
            ERROR_LOG("%s failed with %d: %s", #call, (int)check_ret_,                   \
                      check_msg_ ? check_msg_ : "(no message)");                         \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* The call must fail with `want` and leave a message naming the failure. */
#define EXPECT_ERR(want, call)                                                           \
    do {                                                                                 \
        aclError check_ret_ = (call);                                                    \
        const char *check_msg_ = aclGetRecentErrMsg();                                   \
        if (check_ret_ != (want)) {                                                      \
            ERROR_LOG("%s returned %d, expected %d (%s)", #call, (int)check_ret_,        \
                      (int)(want), check_msg_ ? check_msg_ : "(no message)");            \
            exit(1);                                                                     \
        }                                                                                \
        if (check_msg_ == NULL || check_msg_[0] == '\0') {                               \
            ERROR_LOG("%s failed with %d but left no message", #call, (int)(want));      \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            ERROR_LOG("check failed: %s", #cond);                                        \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#endif /* RUNTIME_ACL_TEST_CHECK_H */
