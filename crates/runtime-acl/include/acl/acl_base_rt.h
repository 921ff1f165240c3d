/*
 * acl/acl_base_rt.h - for programs that include it directly: the basic types and return
 * codes live in acl_base.h.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef RUNTIME_ACL_ACL_BASE_RT_H
#define RUNTIME_ACL_ACL_BASE_RT_H
#include "acl_base.h"
#endif /* RUNTIME_ACL_ACL_BASE_RT_H */
