package main

// Argo CD's health-script runner, replicated from argoproj/argo-cd util/lua/lua.go (runLua,
// decodeValue, ExecuteHealthLua) and util/lua/oslib_safe.go (Apache-2.0): the libraries it opens
// when resource.customizations.useOpenLibs is not set (package, base, table and a safe os with
// time and date only), the object as its decodeValue builds it, a one-second deadline.

import (
	"context"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Argo CD's health status codes (gitops-engine pkg/health); anything else is Unknown.
var validHealth = map[string]bool{
	"Unknown": true, "Progressing": true, "Healthy": true, "Suspended": true, "Degraded": true, "Missing": true,
}

func argoVerdict(u *unstructured.Unstructured, script string) Verdict {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, pair := range []struct {
		n string
		f lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(pair.f), NRet: 0, Protect: true}, lua.LString(pair.n)); err != nil {
			return Verdict{Status: "Unknown", Error: err.Error()}
		}
	}
	l.PreloadModule(lua.OsLibName, safeOsLoader)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("actionParams", l.CreateTable(0, 0))
	l.SetGlobal("obj", decodeValue(l, u.Object))
	fn, err := l.LoadString(script)
	if err == nil {
		l.Push(fn)
		err = l.PCall(0, lua.MultRet, nil)
	}
	if err != nil {
		// Argo CD's controller: a script error is health Unknown with the error as message.
		return Verdict{Status: "Unknown", Error: err.Error()}
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return Verdict{Status: "Unknown", Error: "expect table output from Lua script, not " + l.Get(-1).Type().String()}
	}
	st := lua.LVAsString(ret.RawGetString("status"))
	if !validHealth[st] {
		return Verdict{Status: "Unknown", Message: "Lua returned an invalid health status"}
	}
	return Verdict{Status: st, Message: lua.LVAsString(ret.RawGetString("message"))}
}

func decodeValue(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case int:
		return lua.LNumber(v)
	case int32:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case []any:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}

// The safe os library: os.time and os.date only (oslib_safe.go; os.date here formats "*t" and
// the default only, which no health script of ours calls).
var osFuncs = map[string]lua.LGFunction{"time": osTime, "date": osDate}

func openSafeOs(l *lua.LState) int {
	l.Push(l.RegisterModule(lua.OsLibName, osFuncs))
	return 1
}

func safeOsLoader(l *lua.LState) int {
	l.Push(l.SetFuncs(l.NewTable(), osFuncs))
	return 1
}

func osTime(l *lua.LState) int {
	l.Push(lua.LNumber(time.Now().Unix()))
	return 1
}

func osDate(l *lua.LState) int {
	l.Push(lua.LString(time.Now().Format("02 Jan 06 15:04 MST")))
	return 1
}
