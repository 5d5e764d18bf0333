#include "common/file_util.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <system_error>

namespace parasync {
namespace {

TEST(PathErrorTest, WhatNoRetryCanFixIsFailedPreconditionAndTheRestUnavailable) {
  for (int e : {EACCES, EPERM, EROFS, ENOTDIR, EEXIST, ENOENT, ENAMETOOLONG, ELOOP, EINVAL}) {
    const Status s = PathError("cannot create /x", std::error_code(e, std::generic_category()));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  }
  for (int e : {ENOSPC, EDQUOT, EIO, EMFILE, ENOMEM, EBUSY}) {
    const Status s = PathError("cannot create /x", std::error_code(e, std::generic_category()));
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  }
  // std::filesystem reports errno in the system category.
  EXPECT_EQ(PathError("x", std::error_code(EROFS, std::system_category())).code(),
            StatusCode::kFailedPrecondition);
}

TEST(PathErrorTest, TheMessageIsTheWhatThenTheReason) {
  const Status s =
      PathError("cannot create /proc/x", std::make_error_code(std::errc::permission_denied));
  EXPECT_EQ(s.message(), "cannot create /proc/x: Permission denied");
}

}  // namespace
}  // namespace parasync
