# Copyright (c) 2025, Huawei Technologies Co., Ltd. All rights reserved.
