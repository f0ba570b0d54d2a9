#pragma once
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#define AMPP_EXPECT_THROW_WITH(stmt, text)                                     \
  try {                                                                        \
    stmt;                                                                      \
    ADD_FAILURE() << "expected an exception containing: " << (text);          \
  } catch (const c10::Error& e) {                                              \
    EXPECT_THAT(e.what_without_backtrace(), ::testing::HasSubstr(text));       \
  }
