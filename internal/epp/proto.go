package epp

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// headerValue is a header's value: raw_value when set (Envoy sends raw
// values), else value.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// readHeaders returns m's headers by lower-case name, the first value of
// each.
func readHeaders(m *corev3.HeaderMap) map[string]string {
	out := make(map[string]string, len(m.GetHeaders()))
	for _, h := range m.GetHeaders() {
		k := strings.ToLower(h.GetKey())
		if _, ok := out[k]; !ok {
			out[k] = headerValue(h)
		}
	}
	return out
}

// setHeader is one header set (replacing any value it had).
func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// destination is the dynamic metadata carrying the pick: ns -> {key: v}.
func destination(ns, v string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		ns: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationKey: structpb.NewStringValue(v),
		}}),
	}}
}

// metadataField returns md's field key in namespace ns, or nil.
func metadataField(md *corev3.Metadata, ns, key string) *structpb.Value {
	s := md.GetFilterMetadata()[ns]
	if s == nil {
		return nil
	}
	return s.GetFields()[key]
}

// subset reads the subset hint: the addresses the pick must come from,
// and whether a hint was given. A list of strings, or one string of
// comma-separated addresses.
func subset(md *corev3.Metadata, ns string) (map[string]bool, bool) {
	v := metadataField(md, ns, SubsetKey)
	if v == nil {
		return nil, false
	}
	out := map[string]bool{}
	add := func(s string) {
		for a := range strings.SplitSeq(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				out[a] = true
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	case *structpb.Value_StringValue:
		add(k.StringValue)
	}
	return out, true
}

func requestHeadersResponse(set []*corev3.HeaderValueOption, remove []string, md *structpb.Struct) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				// The destination header decides the route's endpoint:
				// the route cache must not keep the one chosen before.
				ClearRouteCache: true,
				HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove},
			},
		}},
		DynamicMetadata: md,
	}
}

func responseHeadersResponse(set []*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}},
		}},
	}
}

// streamedBody is one body chunk sent back in FULL_DUPLEX_STREAMED mode.
func streamedBody(request bool, b []byte, end bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: end},
		}},
	}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

func trailersResponse(request bool) *extprocv3.ProcessingResponse {
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
}

// immediate is a local reply: status code with an OpenAI error body.
func immediate(code int, body []byte, retryAfter int, details string) *extprocv3.ProcessingResponse {
	set := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if retryAfter > 0 {
		set = append(set, setHeader("retry-after", strconv.Itoa(retryAfter)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: set},
		Body:    body,
		Details: details,
	}}}
}
