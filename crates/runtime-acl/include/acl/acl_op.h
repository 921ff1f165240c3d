/*
 * acl/acl_op.h - single-operator calls. The C library of runtime provides the runtime API
 * only (acl_rt.h); this header exists because acl/acl.h includes it, and declares the
 * operator types so that code naming them compiles. Operators run on virtual devices from
 * Python (runtime.acl.op).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef RUNTIME_ACL_ACL_OP_H
#define RUNTIME_ACL_ACL_OP_H

#include "acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct aclopAttr aclopAttr;
typedef struct aclopHandle aclopHandle;

#ifdef __cplusplus
}
#endif

#endif /* RUNTIME_ACL_ACL_OP_H */
