"""This module include all adaptor function of noop_layers feature.

Copyright (c) 2024, Huawei Technologies Co., Ltd.  All rights reserved.
"""
