@0xdb150d497199194b;
# The envelope of every Ferry frame. Tensor bytes never live here: a frame is a fixed header,
# this envelope, then the bytes of each tensor in `tensors` order (see rpc/frame.cc).

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("ferry::rpc::wire");

enum Kind {
  request @0;
  response @1;
  error @2;
  control @3;
}

enum DType {
  float32 @0;
  float64 @1;
  float16 @2;
  bfloat16 @3;
  int8 @4;
  int16 @5;
  int32 @6;
  int64 @7;
  uint8 @8;
  bool @9;
  complex64 @10;
  complex128 @11;
}

# Element and key types of lists and dicts, so that typed containers (List[int], Dict[str, Tensor])
# come back with the same static type they were sent with.
enum ElementType {
  any @0;
  tensor @1;
  int @2;
  double @3;
  bool @4;
  string @5;
}

struct TensorDesc {
  dtype @0 :DType;
  shape @1 :List(Int64);
  byteLength @2 :UInt64;
  requiresGrad @3 :Bool;
  device @4 :Text;
  undefined @5 :Bool;              # an undefined tensor (e.g. a missing gradient)
}

struct Value {
  union {
    none @0 :Void;
    bool @1 :Bool;
    int @2 :Int64;
    double @3 :Float64;
    string @4 :Text;
    tensor @5 :UInt32;             # index into Envelope.tensors
    intList @6 :List(Int64);
    doubleList @7 :List(Float64);
    boolList @8 :List(Bool);
    tensorList @9 :List(UInt32);
    list @10 :GenericList;
    tuple @11 :List(Value);
    dict @12 :Dict;
    rref @13 :RRefDesc;
  }
}

# A reference to a value held by `owner`. `fork` names this copy of the reference, registered
# with the owner by whoever sent it, so the owner knows when the last copy is gone.
struct RRefDesc {
  owner @0 :Int32;
  idRank @1 :Int32;
  idLocal @2 :UInt64;
  forkRank @3 :Int32;
  forkLocal @4 :UInt64;
}

struct GenericList {
  elementType @0 :ElementType;
  items @1 :List(Value);
}

struct Dict {
  keyType @0 :ElementType;
  valueType @1 :ElementType;
  entries @2 :List(Entry);

  struct Entry {
    key @0 :Value;
    value @1 :Value;
  }
}

struct ErrorInfo {
  kind @0 :UInt8;                  # ferry::rpc::ErrorKind
  message @1 :Text;
  worker @2 :Text;
}

# The handshake that opens every connection (see rpc/auth.h): the accepting side's challenge,
# the connecting side's hello (who is calling, with its proof of the cluster secret), and the
# accepting side's welcome (its own proof).
enum HandshakeStep {
  hello @0;
  challenge @1;
  welcome @2;
}

struct Hello {
  name @0 :Text;
  rank @1 :Int32;
  step @2 :HandshakeStep;
  challenge @3 :Data;
  nonce @4 :Data;
  proof @5 :Data;
}

struct Envelope {
  version @0 :UInt16;
  id @1 :UInt64;
  kind @2 :Kind;
  function @3 :Text;
  value @4 :Value;
  tensors @5 :List(TensorDesc);
  error @6 :ErrorInfo;
  hello @7 :Hello;
  # Set on messages sent inside a distributed autograd context (see ferry/rpc/grad_observer.h);
  # zero otherwise.
  gradContext @8 :Int64;
  gradMessage @9 :Int64;
}

# The rendezvous store's messages (see rpc/store_protocol.h). A connection to the store opens
# with the same handshake as an agent's, in `Hello` messages; then each request gets one reply.
enum StoreOp {
  set @0;
  get @1;
  add @2;
  check @3;
  deleteKey @4;
  numKeys @5;
  wait @6;
  compareSet @7;
}

struct StoreRequest {
  op @0 :StoreOp;
  keys @1 :List(Data);
  value @2 :Data;       # set: the value; compareSet: the value expected
  desired @3 :Data;     # compareSet: the value to set if the expected one is there
  amount @4 :Int64;     # add
  timeoutMs @5 :Int64;  # get, wait: how long to wait for the keys
}

struct StoreReply {
  ok @0 :Bool;     # false: refused or timed out, `error` says why
  value @1 :Data;
  number @2 :Int64;
  error @3 :Text;
}
