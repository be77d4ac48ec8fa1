"""The messages of Triton's ModelConfig that `tchrun export` writes (the subset of
triton-inference-server/common's protobuf/model_config.proto, package `inference`, with its
field numbers and types), built as a protobuf descriptor without protoc, so that
`text_format.Parse` checks a config.pbtxt as Triton's own parser would: an unknown field, a
misspelt enum value or a wrongly typed value is an error.

    enum DataType { TYPE_INVALID = 0; TYPE_BOOL = 1; TYPE_UINT8 = 2; ... TYPE_FP16 = 10;
                    TYPE_FP32 = 11; TYPE_FP64 = 12; TYPE_STRING = 13; TYPE_BF16 = 14; }
    message ModelInstanceGroup { enum Kind { KIND_AUTO = 0; KIND_GPU = 1; KIND_CPU = 2;
        KIND_MODEL = 3; } string name = 1; int32 count = 2; repeated int32 gpus = 3;
        Kind kind = 4; }
    message ModelTensorReshape { repeated int64 shape = 1; }
    message ModelInput { enum Format { FORMAT_NONE = 0; FORMAT_NHWC = 1; FORMAT_NCHW = 2; }
        string name = 1; DataType data_type = 2; Format format = 3; repeated int64 dims = 4;
        ModelTensorReshape reshape = 5; }
    message ModelOutput { string name = 1; DataType data_type = 2; repeated int64 dims = 3;
        string label_filename = 4; ModelTensorReshape reshape = 5; }
    message ModelConfig { string name = 1; string platform = 2; int32 max_batch_size = 4;
        repeated ModelInput input = 5; repeated ModelOutput output = 6;
        repeated ModelInstanceGroup instance_group = 7; string default_model_filename = 8;
        string backend = 17; }
"""
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto

DATA_TYPES = ["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32",
              "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16",
              "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"]


def _enum(parent, name, values):
    e = parent.enum_type.add(name=name)
    for i, v in enumerate(values):
        e.value.add(name=v, number=i)


def _field(msg, name, number, kind, type_name=None, repeated=False):
    f = msg.field.add(name=name, number=number, type=kind)
    f.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
    if type_name:
        f.type_name = type_name


def _file():
    fd = descriptor_pb2.FileDescriptorProto(name="tchrun_model_config.proto", package="inference",
                                            syntax="proto3")
    _enum(fd, "DataType", DATA_TYPES)
    g = fd.message_type.add(name="ModelInstanceGroup")
    _enum(g, "Kind", ["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"])
    _field(g, "name", 1, F.TYPE_STRING)
    _field(g, "count", 2, F.TYPE_INT32)
    _field(g, "gpus", 3, F.TYPE_INT32, repeated=True)
    _field(g, "kind", 4, F.TYPE_ENUM, ".inference.ModelInstanceGroup.Kind")
    r = fd.message_type.add(name="ModelTensorReshape")
    _field(r, "shape", 1, F.TYPE_INT64, repeated=True)
    i = fd.message_type.add(name="ModelInput")
    _enum(i, "Format", ["FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"])
    _field(i, "name", 1, F.TYPE_STRING)
    _field(i, "data_type", 2, F.TYPE_ENUM, ".inference.DataType")
    _field(i, "format", 3, F.TYPE_ENUM, ".inference.ModelInput.Format")
    _field(i, "dims", 4, F.TYPE_INT64, repeated=True)
    _field(i, "reshape", 5, F.TYPE_MESSAGE, ".inference.ModelTensorReshape")
    o = fd.message_type.add(name="ModelOutput")
    _field(o, "name", 1, F.TYPE_STRING)
    _field(o, "data_type", 2, F.TYPE_ENUM, ".inference.DataType")
    _field(o, "dims", 3, F.TYPE_INT64, repeated=True)
    _field(o, "label_filename", 4, F.TYPE_STRING)
    _field(o, "reshape", 5, F.TYPE_MESSAGE, ".inference.ModelTensorReshape")
    c = fd.message_type.add(name="ModelConfig")
    _field(c, "name", 1, F.TYPE_STRING)
    _field(c, "platform", 2, F.TYPE_STRING)
    _field(c, "max_batch_size", 4, F.TYPE_INT32)
    _field(c, "input", 5, F.TYPE_MESSAGE, ".inference.ModelInput", repeated=True)
    _field(c, "output", 6, F.TYPE_MESSAGE, ".inference.ModelOutput", repeated=True)
    _field(c, "instance_group", 7, F.TYPE_MESSAGE, ".inference.ModelInstanceGroup", repeated=True)
    _field(c, "default_model_filename", 8, F.TYPE_STRING)
    _field(c, "backend", 17, F.TYPE_STRING)
    return fd


_pool = descriptor_pool.DescriptorPool()
_fd = _pool.Add(_file())
_desc = _pool.FindFileByName("tchrun_model_config.proto")
ModelConfig = message_factory.GetMessageClass(_desc.message_types_by_name["ModelConfig"])


class DataType:
    @staticmethod
    def Value(name):
        return DATA_TYPES.index(name)
